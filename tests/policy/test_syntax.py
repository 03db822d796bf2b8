"""Tokens and parsing: MOM's lexical rules, and an error with a position for every bad input."""

from __future__ import annotations

import pytest
from policy_helpers import error_of, value_of

from loadmaster.policy import PolicyError, parse
from loadmaster.policy.syntax import MAX_NESTING, ListExpr, Number, Operator, String, Symbol


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42),
        ("-7", -7),
        ("0", 0),
        (".3", 0.3),
        ("-.5", -0.5),
        ("10.0e3", 10000.0),
        ("0123.5", 123.5),
        ("0x1F", 31),
        ("0X1f", 31),
        ("1e3", 1000.0),
        ("100e-2", 1.0),
        ("0o17", 15),
        ("nil", None),
        ('"a b"', "a b"),
        ("'single'", "single"),
    ],
)
def test_literals(text: str, expected: object) -> None:
    value = value_of(text)
    assert value == expected
    assert type(value) is type(expected)


def test_strings_keep_escapes_verbatim_and_span_lines() -> None:
    assert value_of(r'"a\"b"') == 'a\\"b'
    assert value_of('"line1\nline2"') == "line1\nline2"


def test_minus_glued_to_digits_is_part_of_the_number() -> None:
    assert value_of("(+ 1-2)") == -1
    assert value_of("(+5 1)") == 6


def test_symbols_may_contain_dash_and_dot() -> None:
    nodes = parse("a-b x.y _z9", "f")
    assert [n.name for n in nodes if isinstance(n, Symbol)] == ["a-b", "x.y", "_z9"]
    assert value_of("(defvar a-b 3) a-b") == 3


def test_unit_suffix_is_a_separate_symbol() -> None:
    err = error_of("(+ 10M)")
    assert (err.line, err.column, err.message) == (1, 6, "undefined symbol M")


def test_word_operators_lex_as_symbols_and_still_work() -> None:
    (node,) = parse("(and 1 2)", "f")
    assert isinstance(node, ListExpr)
    assert isinstance(node.items[0], Symbol)
    (op,) = parse("(<= 1 2)", "f")
    assert isinstance(op, ListExpr) and isinstance(op.items[0], Operator)


def test_brackets_and_curly_braces() -> None:
    assert value_of("[+ 1 2]") == 3
    assert value_of("{1 2 3}") == 3
    (node,) = parse("{1}", "f")
    assert isinstance(node, ListExpr)
    assert isinstance(node.items[0], Symbol) and node.items[0].name == "eval"
    assert isinstance(node.items[1], Number)


def test_comments_including_last_line_without_newline() -> None:
    assert value_of("# c1\n(+ 1 2) # trailing\n# last") == 3


def test_empty_program_parses_to_nothing() -> None:
    assert parse("", "f") == ()
    assert parse("# only a comment\n\n", "f") == ()


def test_positions_count_every_newline() -> None:
    # MOM drifts here (newlines in comments and strings are not counted); we do not.
    err = error_of('# c1\n# c2\n"two\nlines" (+ 1 x)')
    assert (err.file, err.line, err.column) == ("t.policy", 4, 13)
    assert str(err) == "t.policy:4:13: undefined symbol x"


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("(+ 2 3)\n; note\n(+ 4 5)", 2, 1, "unexpected character ';'"),
        ("(+ 1 @)", 1, 6, "unexpected character '@'"),
        ("(= 1 1)", 1, 2, "unexpected character '='"),
        ("(+ 1 2 %)", 1, 8, "unexpected character '%'"),
        ("(+ 1.)", 1, 5, "unexpected character '.'"),
        ("007", 1, 1, "unexpected character '0'"),
        ('(+ "abc', 1, 4, "unterminated string"),
        ("  'abc\n", 1, 3, "unterminated string"),
        ("0o9", 1, 1, "invalid octal literal 0o9"),
        ("(+ 1 2", 1, 1, "unclosed '('"),
        ("(a (b)\n", 1, 1, "unclosed '('"),
        ("(+ 1 2))", 1, 8, "unexpected ')' without an opening bracket"),
        ("(+ 1 2]", 1, 7, "expected ')' to close '(' opened at 1:1, found ']'"),
        ("{1\n 2)", 2, 3, "expected '}' to close '{' opened at 1:1, found ')'"),
        ("(a \x00)", 1, 4, "unexpected character '\\x00'"),
    ],
)
def test_syntax_errors_have_positions(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse(text, "bad.policy")
    err = info.value
    assert (err.file, err.line, err.column, err.message) == ("bad.policy", line, column, message)
    assert str(err) == f"bad.policy:{line}:{column}: {message}"


def test_nesting_limit() -> None:
    ok = "(" * MAX_NESTING + ")" * MAX_NESTING
    assert len(parse(ok, "f")) == 1
    deep = "(" * (MAX_NESTING + 1) + ")" * (MAX_NESTING + 1)
    with pytest.raises(PolicyError, match="nesting deeper than"):
        parse(deep, "f")
    with pytest.raises(PolicyError, match="nesting deeper than"):
        parse("(" * 100_000, "f")


def test_huge_numbers() -> None:
    with pytest.raises(PolicyError, match="too large"):
        parse("1" * 10_000, "f")
    with pytest.raises(PolicyError, match="exceeds 4096 bits"):
        parse("0x" + "f" * 2000, "f")
    assert value_of("1e999999") == float("inf")
    (node,) = parse("9" * 1000, "f")
    assert isinstance(node, Number)


def test_strings_nodes() -> None:
    (node,) = parse("'x'", "f")
    assert isinstance(node, String) and node.value == "x"
