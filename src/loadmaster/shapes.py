"""The field types every shape is built from, and checking a value against a shape.

A shape is declared once, as a dataclass of the domain whose field types carry their
limits (``Name``, ``Amount``, ...). The API takes it as a request body as it is (FastAPI
validates it with pydantic and documents it in the OpenAPI schema), and the domain checks
the same declaration for Python callers with ``parse``: one declaration, one set of
limits, whichever door a value comes in by.

Types are strict (``"4"`` is not a number, ``true`` is not a count): what a client sends
is taken as it is or refused, never coerced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

from pydantic import Field, Strict, TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from loadmaster.errors import ValidationError

# Placement's bound on every amount: a signed 32-bit integer.
MAX_INT = 2**31 - 1

Name = Annotated[str, Strict(), Field(min_length=1, max_length=255)]
Amount = Annotated[int, Strict(), Field(ge=0, le=MAX_INT)]
# Every amount of an inventory but ``reserved`` is at least 1 (Placement's schema).
PositiveAmount = Annotated[int, Strict(), Field(ge=1, le=MAX_INT)]
Generation = Annotated[int, Strict(), Field(ge=0, le=2**62)]

T = TypeVar("T")

# pydantic's complaint, in the words of the JSON a client sent.
_WORDS = {
    "missing": "is required",
    "missing_argument": "is required",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "dict_type": "must be an object",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "frozen_set_type": "must be a list",
    "set_type": "must be a list",
    "sequence_str": "must be a list, not a string",
    "finite_number": "must be a finite number",
}


def field_path(loc: Sequence[int | str], prefix: str = "") -> str | None:
    """``("inventories", "VCPU", "total")`` -> ``inventories.VCPU.total``; list positions
    become ``[i]``, as in every error field the domain names."""
    text = prefix
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or None


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(kind: type[Any]) -> TypeAdapter[Any]:
    # Building an adapter compiles a validator (a millisecond); each shape builds one.
    if kind not in _ADAPTERS:
        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


def parse(kind: type[T], data: Any, field: str = "") -> T:
    """``data`` (JSON-like: dicts, lists, numbers, strings) checked against ``kind``; the
    first problem is raised as a ``ValidationError`` naming its field under ``field``."""
    try:
        return _adapter(kind).validate_python(data)
    except PydanticValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        where = field_path(first["loc"], field)
        if first["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            message = f"{where} is not a field of {getattr(kind, '__name__', 'this object')}"
        else:
            message = f"{where or getattr(kind, '__name__', 'value')} {_words(first)}"
        more = len(errors) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ValidationError(message + suffix, field=where) from None


def check(value: Any, field: str = "") -> None:
    """A dataclass built in Python (whose constructor checks nothing) checked against its
    own declaration, as ``parse`` checks what a client sends."""
    # Only the top level as a dict (``asdict`` copies every list: half the check's cost);
    # a nested dataclass as a dict too, since pydantic would take its instance unchecked.
    data = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    parse(type(value), data, field)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list | tuple) and any(
        dataclasses.is_dataclass(item) and not isinstance(item, type) for item in value
    ):
        return [_plain(item) for item in value]
    return value


# pydantic's bound errors in words: its error type -> (the words, the ``ctx`` key).
BOUND_WORDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("above", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("below", "lt"),
}


def _words(error: Any) -> str:
    kind, ctx, got = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "string_too_short" and ctx.get("min_length") == 1:
        return "must be a non-empty string"
    if kind == "string_too_long":
        return f"must be a string of at most {ctx.get('max_length')} characters"
    if kind in BOUND_WORDS:
        words, key = BOUND_WORDS[kind]
        return f"must be {words} {ctx.get(key)}, got {got!r}"
    if kind in _WORDS:
        return _WORDS[kind] + ("" if kind.startswith("missing") else f", got {got!r}")
    if kind == "value_error":  # a validator of ours, which words its own reason
        return str(error["msg"]).removeprefix("Value error, ")
    return "is invalid: " + str(error["msg"])


def dump(value: Any) -> dict[str, Any]:
    """A dataclass as JSON-ready data, by its declaration."""
    return _adapter(type(value)).dump_python(value, mode="json")
