"""Evaluating parsed policy code with MOM's semantics, quirks included.

Faithful to MOM: true division; ``and``/``or`` evaluate every argument before choosing;
``if`` needs an else; scoping is dynamic (a function body sees its caller's variables);
``defvar`` never overwrites a name already in the innermost scope; ``set`` on a name no
scope holds is an error; function arguments are evaluated inside the callee's new scope,
one after the other; a variable holding a callable shadows the built-ins, and the
built-ins shadow user functions; operators answer to their internal names too
(``(add 1 2)`` is ``(+ 1 2)``).

Different from MOM, on purpose: every error is a ``PolicyError`` with file, line and
column; only attributes an object exposes are reachable (no ``x.real``); ``a.b.c`` is an
error instead of silently meaning ``a.b``; a cycle is bounded in nesting depth, steps
(every ``with`` iteration counts, whatever it iterates over), memory (each string or list
at most ``MAX_SEQUENCE`` long, and at most ``DEFAULT_MAX_ALLOCATED`` items or characters
built per cycle) and wall time, so no policy can crash Python's stack, exhaust memory or
hang a cycle. Exceeding a bound raises ``PolicyLimitError`` where evaluation stood.

This module evaluates the policy language, with MOM's semantics.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from loadmaster.policy.errors import PolicyError, PolicyLimitError
from loadmaster.policy.syntax import MAX_INT_BITS, ListExpr, Node, Number, Operator, String, Symbol
from loadmaster.policy.values import MISSING, Builtin, Exposed, Fault, Value, describe

log = logging.getLogger("loadmaster.policy")

# Each level of nesting costs about three Python frames, so this stays well inside
# Python's default recursion limit of 1000 even when the caller is itself deep.
MAX_DEPTH = 150
DEFAULT_MAX_STEPS = 2_000_000
# No MOM policy builds strings or lists beyond a few names; these bounds leave a wide
# margin while keeping one cycle's memory in the tens of megabytes whatever the text.
MAX_SEQUENCE = 100_000
DEFAULT_MAX_ALLOCATED = 4_000_000
# Wall time is read every this many steps: often enough to stop within milliseconds of
# the deadline, rarely enough not to slow the interpreter's hot loop.
_CLOCK_EVERY = 256

OPERATOR_NAMES = {
    "+": "add",
    "-": "sub",
    "*": "mul",
    "/": "div",
    "<": "lt",
    ">": "gt",
    "<=": "lte",
    ">=": "gte",
    "<<": "shl",
    ">>": "shr",
    "==": "eq",
    "!=": "neq",
}
_SYMBOL_OF = {name: op for op, name in OPERATOR_NAMES.items()}


class Limit(Fault):
    """A built-in refused to build a value beyond a memory bound."""


def _check_int(value: Value) -> Value:
    if type(value) is int and value.bit_length() > MAX_INT_BITS:
        raise Limit(f"integer result exceeds {MAX_INT_BITS} bits")
    return value


def _sequence_len(value: Value) -> int | None:
    return len(value) if isinstance(value, str | list) else None


def _add(x: Value, y: Value) -> Value:
    lx, ly = _sequence_len(x), _sequence_len(y)
    if lx is not None and ly is not None and lx + ly > MAX_SEQUENCE:
        raise Limit(f"result longer than {MAX_SEQUENCE} items or characters")
    return _check_int(x + y)  # type: ignore[operator]


def _sub(x: Value, y: Value) -> Value:
    return _check_int(x - y)  # type: ignore[operator]


def _mul(x: Value, y: Value) -> Value:
    for seq, count in ((x, y), (y, x)):
        length = _sequence_len(seq)
        if length is not None and isinstance(count, int) and length * count > MAX_SEQUENCE:
            raise Limit(f"result longer than {MAX_SEQUENCE} items or characters")
    return _check_int(x * y)  # type: ignore[operator]


def _shl(x: Value, y: Value) -> Value:
    if isinstance(x, int) and isinstance(y, int) and x and x.bit_length() + y > MAX_INT_BITS:
        raise Limit(f"integer result exceeds {MAX_INT_BITS} bits")
    return x << y  # type: ignore[operator]


# Any, because the comparison operators are typed for orderable operands only.
BINARY: dict[str, Callable[[Any, Any], Value]] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "div": operator.truediv,
    "lt": operator.lt,
    "gt": operator.gt,
    "lte": operator.le,
    "gte": operator.ge,
    "shl": _shl,
    "shr": operator.rshift,
    "eq": operator.eq,
    "neq": operator.ne,
}


def _and(args: list[Value]) -> Value:
    for arg in args:
        if not arg:
            return arg
    return args[-1]


def _or(args: list[Value]) -> Value:
    for arg in args:
        if arg:
            return arg
    return args[-1]


def _null(args: list[Value]) -> Value:
    # MOM: a value without a length (a number) is neither nil nor empty.
    return all(v is None or (isinstance(v, str | list) and len(v) == 0) for v in args)


def _valid(args: list[Value]) -> Value:
    return all(v is not None for v in args)


# Built-ins whose arguments are all evaluated: name -> (min args, max args, function).
VARIADIC: dict[str, tuple[int, int | None, Callable[[list[Value]], Value]]] = {
    "and": (1, None, _and),
    "or": (1, None, _or),
    "not": (1, 1, lambda args: not args[0]),
    "min": (1, None, lambda args: min(args)),  # type: ignore[type-var]
    "max": (1, None, lambda args: max(args)),  # type: ignore[type-var]
    "null": (0, None, _null),
    "valid": (0, None, _valid),
}


def _abs(x: Value) -> Value:
    try:
        return abs(x)  # type: ignore[arg-type]
    except TypeError:
        raise Fault(f"abs needs a number, got {describe(x)}") from None


def _debug(*values: Value) -> Value:
    log.debug("debug: %r", values)
    return values[-1]


def global_scope(host: Value, guests: list[Value]) -> dict[str, Value]:
    """The bottom scope MOM gives every cycle: its two Python helpers and the entities."""
    return {
        "abs": Builtin("abs", _abs, 1, 1),
        "debug": Builtin("debug", _debug, 1, None),
        "Host": host,
        "Guests": guests,
    }


class Evaluator:
    """One cycle's interpreter state: the scope stack, the function table and the budgets.

    ``max_seconds`` bounds the cycle's wall time (None: unbounded), measured with ``clock``
    from the evaluator's creation, or up to ``deadline`` when given (a cycle evaluated
    more than once shares one deadline).
    """

    def __init__(
        self,
        bottom: dict[str, Value],
        max_steps: int = DEFAULT_MAX_STEPS,
        *,
        max_seconds: float | None = None,
        max_allocated: int = DEFAULT_MAX_ALLOCATED,
        clock: Callable[[], float] = time.monotonic,
        deadline: float | None = None,
    ) -> None:
        self.scopes: list[dict[str, Value]] = [bottom]
        self.functions: dict[str, tuple[tuple[str, ...], Node]] = {}
        self.depth = 0
        self.steps = 0
        self.max_steps = max_steps
        self.allocated = 0
        self.max_allocated = max_allocated
        self.clock = clock
        self.max_seconds = max_seconds
        if deadline is None and max_seconds is not None:
            deadline = clock() + max_seconds
        self.deadline = deadline
        # Where evaluation stands, for errors that have no node of their own (MemoryError).
        self.where: Node | None = None

    def run(self, program: Iterable[Node]) -> None:
        try:
            for expr in program:
                self.where = expr
                self.eval(expr)
        except RecursionError:
            # A safety net only: MAX_DEPTH is meant to trigger first.
            raise self._limit("evaluation nested too deeply") from None
        except MemoryError:
            # A safety net only: the sequence and allocation bounds are meant to trigger first.
            raise self._limit("out of memory") from None

    def _limit(self, message: str, node: Node | None = None) -> PolicyLimitError:
        node = node or self.where
        if node is None:
            return PolicyLimitError("<policy>", 0, 0, message)
        return PolicyLimitError(*node.pos, message)

    def _step(self, node: Node) -> None:
        """Count one step of the cycle's budget at ``node``, and watch the clock."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise self._limit(f"evaluation exceeded {self.max_steps} steps", node)
        if (
            self.deadline is not None
            and self.steps % _CLOCK_EVERY == 0
            and self.clock() > self.deadline
        ):
            raise self._limit(f"evaluation exceeded {self.max_seconds:g} s", node)

    def _charge(self, node: Node, size: int) -> None:
        """Charge ``size`` new list items or characters to the cycle's memory budget."""
        self.allocated += size
        if self.allocated > self.max_allocated:
            raise self._limit(
                f"evaluation built more than {self.max_allocated} list items or characters",
                node,
            )

    def _allocate(self, node: Node, value: Value) -> Value:
        if isinstance(value, str | list):
            self._charge(node, len(value))
        return value

    # -- lookup -------------------------------------------------------------------------

    def _find(self, base: str, attr: str | None) -> Value:
        for scope in reversed(self.scopes):
            if base in scope:
                obj = scope[base]
                if attr is None:
                    return obj
                # MOM skips a scope whose value lacks the attribute and keeps looking.
                if isinstance(obj, Exposed):
                    found = obj.attribute(attr)
                    if found is not MISSING:
                        return found
        return MISSING

    def _symbol(self, sym: Symbol) -> Value:
        if sym.name == "nil":
            return None
        if sym.nested:
            raise PolicyError(
                *sym.pos, f"{sym.name}: only one level of attribute access is supported"
            )
        try:
            value = self._find(sym.base, sym.attr)
        except Fault as exc:
            raise PolicyError(*sym.pos, str(exc)) from None
        if value is MISSING:
            raise PolicyError(*sym.pos, f"undefined symbol {sym.name}")
        return value

    # -- evaluation ---------------------------------------------------------------------

    def eval(self, node: Node) -> Value:
        # Exact type tests, most frequent first: this is the interpreter's hot loop.
        if type(node) is Symbol:
            return self._symbol(node)
        if type(node) is Number or type(node) is String:
            return node.value
        if type(node) is Operator:
            raise PolicyError(*node.pos, f"operator {node.op} used as a value")
        assert isinstance(node, ListExpr)
        items = node.items
        if not items:
            raise PolicyError(*node.pos, "empty expression ()")
        self.where = node
        self._step(node)
        if self.depth >= MAX_DEPTH:
            raise PolicyError(*node.pos, f"evaluation nested deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return self._apply(node, items)
        finally:
            self.depth -= 1

    def _apply(self, node: ListExpr, items: tuple[Node, ...]) -> Value:
        head = items[0]
        if isinstance(head, Symbol):
            if head.nested:
                raise PolicyError(
                    *head.pos, f"{head.name}: only one level of attribute access is supported"
                )
            name = head.name
            value = self._find(head.base, head.attr)
        elif isinstance(head, Operator):
            name = OPERATOR_NAMES[head.op]
            value = self._find(name, None)
        else:
            kind = "list" if isinstance(head, ListExpr) else type(head).__name__.lower()
            raise PolicyError(*head.pos, f"a {kind} cannot be called; expected a name")
        args = items[1:]

        if value is not MISSING and value is not None:
            if not isinstance(value, Builtin):
                raise PolicyError(*head.pos, f"{name} is not a function (it is {describe(value)})")
            values = [self.eval(a) for a in args]
            try:
                return value.call(values)
            except Fault as exc:
                raise PolicyError(*node.pos, str(exc)) from None

        binary = BINARY.get(name)
        if binary is not None:
            self._arity(node, name, args, 2, 2)
            x = self.eval(args[0])
            y = self.eval(args[1])
            try:
                return self._allocate(node, binary(x, y))
            except Limit as exc:
                raise self._limit(str(exc), node) from None
            except Fault as exc:
                raise PolicyError(*node.pos, str(exc)) from None
            except ZeroDivisionError:
                raise PolicyError(*node.pos, "division by zero") from None
            except (TypeError, ValueError, ArithmeticError) as exc:
                symbol = _SYMBOL_OF[name]
                raise PolicyError(
                    *node.pos, f"cannot apply {symbol} to {describe(x)} and {describe(y)} ({exc})"
                ) from None

        variadic = VARIADIC.get(name)
        if variadic is not None:
            low, high, fn = variadic
            self._arity(node, name, args, low, high)
            values = [self.eval(a) for a in args]
            try:
                return fn(values)
            except (TypeError, ValueError) as exc:
                raise PolicyError(*node.pos, f"{name}: {exc}") from None

        form = _FORMS.get(name)
        if form is not None:
            return form(self, node, args)

        if name == "eval":
            self._arity(node, "eval", args, 1, None)
            result: Value = None
            for a in args:
                result = self.eval(a)
            return result

        function = self.functions.get(name)
        if function is None:
            raise PolicyError(*head.pos, f"undefined function {name}")
        params, body = function
        if len(params) != len(args):
            raise PolicyError(
                *node.pos,
                f"function {name} takes {len(params)} argument(s), got {len(args)}",
            )
        scope: dict[str, Value] = {}
        self.scopes.append(scope)
        try:
            for param, arg in zip(params, args, strict=True):
                # MOM binds like let*: each argument is evaluated inside the new scope.
                scope.setdefault(param, self.eval(arg))
            return self.eval(body)
        finally:
            self.scopes.pop()

    @staticmethod
    def _arity(node: ListExpr, name: str, args: Sequence[Node], low: int, high: int | None) -> None:
        count = len(args)
        if low <= count and (high is None or count <= high):
            return
        if high == low:
            wanted = f"exactly {low}"
        elif high is None:
            wanted = f"at least {low}"
        else:
            wanted = f"{low} to {high}"
        raise PolicyError(*node.pos, f"{name} takes {wanted} argument(s), got {count}")

    @staticmethod
    def _name(node: Node, form: str) -> str:
        if not isinstance(node, Symbol):
            raise PolicyError(*node.pos, f"{form} expects a name here")
        return node.name

    # -- special forms ------------------------------------------------------------------

    def _defvar(self, node: ListExpr, args: tuple[Node, ...]) -> Value:
        self._arity(node, "defvar", args, 2, 2)
        name = self._name(args[0], "defvar")
        value = self.eval(args[1])
        scope = self.scopes[-1]
        return scope.setdefault(name, value)

    def _set(self, node: ListExpr, args: tuple[Node, ...]) -> Value:
        self._arity(node, "set", args, 2, 2)
        name = self._name(args[0], "set")
        value = self.eval(args[1])
        for scope in reversed(self.scopes):
            if name in scope:
                scope[name] = value
                return value
        raise PolicyError(*args[0].pos, f"undefined symbol {name} (set needs a defvar first)")

    def _def(self, node: ListExpr, args: tuple[Node, ...]) -> Value:
        self._arity(node, "def", args, 3, 3)
        name = self._name(args[0], "def")
        params = args[1]
        if not isinstance(params, ListExpr) or not all(isinstance(p, Symbol) for p in params.items):
            raise PolicyError(*params.pos, f"def {name}: parameters must be a list of names")
        self.functions[name] = (
            tuple(p.name for p in params.items if isinstance(p, Symbol)),
            args[2],
        )
        return name

    def _let(self, node: ListExpr, args: tuple[Node, ...]) -> Value:
        self._arity(node, "let", args, 2, None)
        bindings = args[0]
        if not isinstance(bindings, ListExpr):
            raise PolicyError(*bindings.pos, "let expects a list of (name value) bindings")
        scope: dict[str, Value] = {}
        self.scopes.append(scope)
        try:
            for binding in bindings.items:
                if (
                    not isinstance(binding, ListExpr)
                    or len(binding.items) != 2
                    or not isinstance(binding.items[0], Symbol)
                ):
                    raise PolicyError(*binding.pos, "let binding must be (name value)")
                target = binding.items[0]
                assert isinstance(target, Symbol)
                scope.setdefault(target.name, self.eval(binding.items[1]))
            result: Value = None
            for body in args[1:]:
                result = self.eval(body)
            return result
        finally:
            self.scopes.pop()

    def _with(self, node: ListExpr, args: tuple[Node, ...]) -> Value:
        self._arity(node, "with", args, 3, 3)
        source = args[0]
        if not isinstance(source, Symbol):
            raise PolicyError(*source.pos, "with expects the name of a list here")
        item = self._name(args[1], "with")
        items = self._symbol(source)
        if not isinstance(items, list | tuple | str):
            raise PolicyError(*source.pos, f"with: {source.name} is {describe(items)}, not a list")
        results: list[Value] = []
        body = args[2]
        over_guests = items is self.scopes[0].get("Guests")
        for element in items:
            # Counted here, not only in eval: a body that is a bare name or number costs no
            # step of its own, and ``(with s a 0)`` over a long string must still be bounded.
            self._step(body)
            self._charge(node, 1)
            self.scopes.append({item: element})
            try:
                results.append(self.eval(body))
            except PolicyError as exc:
                if over_guests and exc.subject is None:
                    exc.subject = element
                raise
            finally:
                self.scopes.pop()
        return results

    def _if(self, node: ListExpr, args: tuple[Node, ...]) -> Value:
        if len(args) == 2:
            raise PolicyError(*node.pos, "if needs an else branch: (if condition then else)")
        self._arity(node, "if", args, 3, 3)
        return self.eval(args[1]) if self.eval(args[0]) else self.eval(args[2])


_FORMS: dict[str, Callable[[Evaluator, ListExpr, tuple[Node, ...]], Value]] = {
    "defvar": Evaluator._defvar,
    "set": Evaluator._set,
    "setq": Evaluator._set,
    "def": Evaluator._def,
    "defun": Evaluator._def,
    "let": Evaluator._let,
    "with": Evaluator._with,
    "if": Evaluator._if,
}
