"""Reading MOM policy text: tokens with MOM's precedence rules, then an iterative parser.

The token rules are MOM's, including its first-match (not longest-match) order, so the
same text splits into the same tokens: ``10M`` is the number 10 followed by the symbol
``M``, ``(+ 1-2)`` adds 1 and -2, ``a-b`` is one symbol. Where MOM's scanner would
silently drop the rest of the file (an unknown character, an unterminated string, ``1.``)
this one raises a ``PolicyError`` at the exact line and column. Nesting is parsed with
an explicit stack and capped, so hostile input cannot exhaust Python's recursion.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

from loadmaster.policy.errors import PolicyError

MAX_NESTING = 100
# Any realistic memory or CPU figure fits in 64 bits; the cap keeps a hostile policy
# from building integers whose arithmetic would take minutes.
MAX_INT_BITS = 4096


class Pos(NamedTuple):
    file: str
    line: int
    column: int


class Node:
    __slots__ = ("pos",)

    def __init__(self, pos: Pos) -> None:
        self.pos = pos


class Number(Node):
    __slots__ = ("value",)

    def __init__(self, pos: Pos, value: int | float) -> None:
        super().__init__(pos)
        self.value = value


class String(Node):
    __slots__ = ("value",)

    def __init__(self, pos: Pos, value: str) -> None:
        super().__init__(pos)
        self.value = value


class Symbol(Node):
    """A name; ``base``/``attr`` split it at the first dot for ``guest.balloon_cur``."""

    __slots__ = ("attr", "base", "name", "nested")

    def __init__(self, pos: Pos, name: str) -> None:
        super().__init__(pos)
        self.name = name
        parts = name.split(".", 2)
        self.base = parts[0]
        self.attr = parts[1] if len(parts) > 1 else None
        self.nested = len(parts) > 2


class Operator(Node):
    __slots__ = ("op",)

    def __init__(self, pos: Pos, op: str) -> None:
        super().__init__(pos)
        self.op = op


class ListExpr(Node):
    __slots__ = ("items",)

    def __init__(self, pos: Pos, items: tuple[Node, ...]) -> None:
        super().__init__(pos)
        self.items = items


# Alternatives in MOM's order (its scanner tries token rules alphabetically by method
# name and keeps the first that matches). MOM writes the float prefix as
# ``(0|[1-9][0-9]*)*``, which matches the same strings as ``[0-9]*`` but backtracks
# exponentially on long digit runs; the simpler form keeps huge numbers linear. MOM's
# word operators (and, min, valid, ...) always lex as symbols first, so only the
# punctuation ones are listed.
_TOKEN_RE = re.compile(
    r"""
     (?P<bracket>[()\[\]{}])
    |(?P<float>-?[0-9]*\.[0-9]+(?:[eE][+-]?[0-9]+)?)
    |(?P<hex>0[xX][0-9A-Fa-f]+)
    |(?P<integer>-?(?:0(?![0-9xXo])|[1-9][0-9]*)(?![0-9eE]))
    |(?P<expint>-?(?:0(?![0-9xX])|[1-9][0-9]*)[eE][+-]?[0-9]+)
    |(?P<octal>0o[0-9]+)
    |(?P<comment>\#[^\n]*(?:\n|\Z))
    |(?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    |(?P<symbol>[A-Za-z_][A-Za-z0-9_.\-]*)
    |(?P<operator><=|>=|<<|>>|==|!=|[-+*/<>])
    |(?P<ws>\s+)
    """,
    re.VERBOSE | re.DOTALL,
)

_CLOSERS = {"(": ")", "[": "]", "{": "}"}


class _Token(NamedTuple):
    kind: str
    text: str
    pos: Pos


def _tokens(text: str, filename: str) -> Iterator[_Token]:
    index = 0
    line = 1
    line_start = 0
    end = len(text)
    match = _TOKEN_RE.match
    while index < end:
        m = match(text, index)
        pos = Pos(filename, line, index - line_start + 1)
        if m is None:
            char = text[index]
            if char in "\"'":
                raise PolicyError(*pos, "unterminated string")
            raise PolicyError(*pos, f"unexpected character {char!r}")
        kind = m.lastgroup
        assert kind is not None
        token_text = m.group()
        newlines = token_text.count("\n")
        if newlines:
            line += newlines
            line_start = index + token_text.rindex("\n") + 1
        index = m.end()
        if kind not in ("ws", "comment"):
            yield _Token(kind, token_text, pos)


def _number(token: _Token) -> Number:
    text = token.text
    try:
        if token.kind in ("float", "expint"):
            return Number(token.pos, float(text))
        if token.kind == "octal" and not set(text[2:]) <= set("01234567"):
            raise PolicyError(*token.pos, f"invalid octal literal {text}")
        value = int(text, 0)
    except ValueError:
        raise PolicyError(*token.pos, f"number {text[:20]}... is too large") from None
    if value.bit_length() > MAX_INT_BITS:
        raise PolicyError(*token.pos, f"integer literal exceeds {MAX_INT_BITS} bits")
    return Number(token.pos, value)


def parse(text: str, filename: str = "<policy>") -> tuple[Node, ...]:
    """Parse one policy file into its top-level expressions (possibly none)."""
    top: list[Node] = []
    current = top
    # Each open bracket remembers its character, position and the list it belongs to.
    open_stack: list[tuple[str, Pos, list[Node]]] = []
    for token in _tokens(text, filename):
        kind = token.kind
        if kind == "bracket":
            char = token.text
            if char in _CLOSERS:
                if len(open_stack) >= MAX_NESTING:
                    raise PolicyError(*token.pos, f"nesting deeper than {MAX_NESTING} levels")
                open_stack.append((char, token.pos, current))
                # MOM reads ``{a b}`` as ``(eval a b)``.
                current = [Symbol(token.pos, "eval")] if char == "{" else []
                continue
            if not open_stack:
                raise PolicyError(*token.pos, f"unexpected {char!r} without an opening bracket")
            opener, opened_at, parent = open_stack.pop()
            if _CLOSERS[opener] != char:
                raise PolicyError(
                    *token.pos,
                    f"expected {_CLOSERS[opener]!r} to close {opener!r} opened at "
                    f"{opened_at.line}:{opened_at.column}, found {char!r}",
                )
            parent.append(ListExpr(opened_at, tuple(current)))
            current = parent
        elif kind == "string":
            # MOM keeps escapes verbatim: "a\"b" is the four characters a \ " b.
            current.append(String(token.pos, token.text[1:-1]))
        elif kind == "symbol":
            current.append(Symbol(token.pos, token.text))
        elif kind == "operator":
            current.append(Operator(token.pos, token.text))
        else:
            current.append(_number(token))
    if open_stack:
        opener, opened_at, _ = open_stack[-1]
        raise PolicyError(*opened_at, f"unclosed {opener!r}")
    return tuple(top)
