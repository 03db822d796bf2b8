"""What a policy value can be, and the hook that lets Python objects show attributes to it.

Policy values are plain Python objects (numbers, strings, ``None`` for nil, lists from
``with``) plus a few exposed objects: entities, IO-tune entries and callable built-ins.
MOM lets a dotted name reach *any* Python attribute (``x.real``, ``e.__class__``); here
only what an ``Exposed`` object chooses to show is reachable.
"""

from __future__ import annotations

from collections.abc import Callable

Value = object


class Fault(Exception):
    """An error inside a built-in; the evaluator adds the file, line and column."""


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


class Exposed:
    """An object whose named attributes a policy may read with ``obj.name``."""

    __slots__ = ()

    def attribute(self, name: str) -> Value:
        """Return the attribute, or ``MISSING`` when there is none by that name."""
        return MISSING


class Builtin:
    """A Python function callable from a policy, with its arity checked before the call."""

    __slots__ = ("fn", "max_args", "min_args", "name")

    def __init__(
        self, name: str, fn: Callable[..., Value], min_args: int, max_args: int | None
    ) -> None:
        self.name = name
        self.fn = fn
        self.min_args = min_args
        self.max_args = max_args

    def call(self, args: list[Value]) -> Value:
        count = len(args)
        if count < self.min_args or (self.max_args is not None and count > self.max_args):
            if self.max_args == self.min_args:
                wanted = str(self.min_args)
            elif self.max_args is None:
                wanted = f"at least {self.min_args}"
            else:
                wanted = f"{self.min_args} to {self.max_args}"
            raise Fault(f"{self.name} takes {wanted} argument(s), got {count}")
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"<builtin {self.name}>"


def describe(value: Value) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, int | float):
        text = repr(value)
        return f"number {text if len(text) < 40 else text[:37] + '...'}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    if isinstance(value, list):
        return f"list of {len(value)}"
    return repr(value)[:60]
