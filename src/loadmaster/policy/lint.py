"""Static shape checks: errors MOM would only hit when the faulty branch finally runs.

MOM (and the evaluator, which follows it) reports ``(if c x)`` or ``(+ 1)`` only when
that expression is evaluated, which for a rarely taken branch can be months later.
``policy check`` finds them up front. It assumes no variable shadows a built-in.
"""

from __future__ import annotations

from loadmaster.policy.errors import PolicyError
from loadmaster.policy.evaluator import BINARY, OPERATOR_NAMES, VARIADIC
from loadmaster.policy.syntax import ListExpr, Node, Operator, Symbol

# name -> (min args, max args); None = unbounded
_SHAPES: dict[str, tuple[int, int | None]] = {
    **{name: (2, 2) for name in BINARY},
    **{name: (low, high) for name, (low, high, _) in VARIADIC.items()},
    "defvar": (2, 2),
    "set": (2, 2),
    "setq": (2, 2),
    "def": (3, 3),
    "defun": (3, 3),
    "let": (2, None),
    "with": (3, 3),
    "if": (3, 3),
    "eval": (1, None),
}


def _problem(node: Node, message: str) -> PolicyError:
    return PolicyError(*node.pos, message)


def _check_list(node: ListExpr, problems: list[PolicyError], pending: list[Node]) -> None:
    """Check one call and queue the sub-expressions that are evaluated as code."""
    if not node.items:
        problems.append(_problem(node, "empty expression ()"))
        return
    head, args = node.items[0], node.items[1:]
    if isinstance(head, Operator):
        name = OPERATOR_NAMES[head.op]
    elif isinstance(head, Symbol):
        name = head.name
        if head.nested:
            problems.append(_problem(head, "only one level of attribute access is supported"))
    else:
        problems.append(_problem(head, "only a name can be called"))
        pending.extend(node.items)
        return
    shape = _SHAPES.get(name)
    if shape is not None:
        low, high = shape
        if len(args) < low or (high is not None and len(args) > high):
            wanted = (
                str(low) if low == high else f"at least {low}" if high is None else f"{low}-{high}"
            )
            message = f"{name} takes {wanted} argument(s), got {len(args)}"
            if name == "if" and len(args) == 2:
                message = "if needs an else branch: (if condition then else)"
            problems.append(_problem(node, message))
            return
    if name in ("defvar", "set", "setq", "def", "defun", "with") and not isinstance(
        args[0], Symbol
    ):
        problems.append(_problem(args[0], f"{name} expects a name here"))
    if name in ("def", "defun"):
        params = args[1]
        if not isinstance(params, ListExpr) or not all(isinstance(p, Symbol) for p in params.items):
            problems.append(_problem(params, "parameters must be a list of names"))
        pending.append(args[2])
    elif name in ("defvar", "set", "setq"):
        pending.append(args[1])
    elif name == "with":
        if not isinstance(args[1], Symbol):
            problems.append(_problem(args[1], "with expects a name here"))
        pending.append(args[2])
    elif name == "let":
        bindings = args[0]
        if not isinstance(bindings, ListExpr):
            problems.append(_problem(bindings, "let expects a list of (name value) bindings"))
        else:
            for binding in bindings.items:
                if (
                    isinstance(binding, ListExpr)
                    and len(binding.items) == 2
                    and isinstance(binding.items[0], Symbol)
                ):
                    pending.append(binding.items[1])
                else:
                    problems.append(_problem(binding, "let binding must be (name value)"))
        pending.extend(args[1:])
    else:
        pending.extend(args)


def lint(program: tuple[Node, ...]) -> list[PolicyError]:
    problems: list[PolicyError] = []
    pending: list[Node] = list(reversed(program))
    while pending:
        node = pending.pop()
        if isinstance(node, Operator):
            problems.append(_problem(node, f"operator {node.op} used as a value"))
        elif isinstance(node, Symbol) and node.nested:
            problems.append(_problem(node, "only one level of attribute access is supported"))
        elif isinstance(node, ListExpr):
            found: list[Node] = []
            _check_list(node, problems, found)
            pending.extend(reversed(found))
    problems.sort(key=lambda p: (p.line, p.column))
    return problems
