"""Malformed input never escapes as anything but PolicyError, and never hangs."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import guest, host

from loadmaster.policy import Policy, PolicyError, check_files, parse

SNAP_HOST = host(mem_available=100, mem_free=10)
SNAP_GUESTS = [
    guest("a", tags=["gold"], balloon_cur=5, mem_unused=None),
    guest("b", balloon_cur=None),
]

ATOMS = [
    "nil",
    "1",
    "-2",
    "0.5",
    "1e400",
    "0x10",
    "0o7",
    '"s"',
    "'t'",
    "x",
    "Host",
    "Guests",
    "Host.mem_free",
    "g.balloon_cur",
    "g.nope",
    "a.b.c",
    "abs",
    "debug",
    "+",
    "-",
    "*",
    "/",
    "<",
    "<<",
    ">>",
    "==",
    "and",
    "or",
    "not",
    "min",
    "max",
    "null",
    "valid",
    "if",
    "let",
    "with",
    "def",
    "defvar",
    "set",
    "eval",
    "f",
    "g",
    '(Host.StatAvg "mem_free")',
    '(g.Control "c" 1)',
    '(g.HasTag "gold")',
    "99999999999999999999999999",
]


def expressions() -> st.SearchStrategy[str]:
    return st.recursive(
        st.sampled_from(ATOMS),
        lambda children: st.tuples(
            st.sampled_from(["(", "[", "{"]), st.lists(children, max_size=5)
        ).map(lambda t: t[0] + " ".join(t[1]) + {"(": ")", "[": "]", "{": "}"}[t[0]]),
        max_leaves=30,
    )


def run(text: str) -> None:
    try:
        policy = Policy([*Policy.from_text(text).files], max_steps=20_000)
        policy.evaluate(SNAP_HOST, SNAP_GUESTS)
    except PolicyError as exc:
        assert exc.file in ("policy.policy", "<policy>")
        assert exc.message


@settings(max_examples=300, deadline=None)
@given(st.lists(expressions(), min_size=1, max_size=4))
def test_random_programs(exprs: list[str]) -> None:
    run('(defvar x 1)(def f (g) (g.Control "c" g.balloon_cur))\n' + "\n".join(exprs))


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from("()[]{}\"'#;.-+*/<>=!0123456789eExo abfgHnil\n\t\\@"), max_size=80
    )
)
def test_random_policy_text(text: str) -> None:
    run(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_random_unicode(text: str) -> None:
    run(text)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_through_files(data: bytes) -> None:
    # check_files reads the file itself, so undecodable bytes are exercised too.
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.policy"
        path.write_bytes(data)
        for problem in check_files([path]):
            assert isinstance(problem, PolicyError)
            assert problem.file == "r.policy"


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5000), st.sampled_from(["(", "[", "{", "(+ 1 "]))
def test_deep_nesting(depth: int, opener: str) -> None:
    closer = {"(": ")", "[": "]", "{": "}", "(+ 1 ": ")"}[opener]
    run(opener * depth + "1" + closer * depth)


@settings(max_examples=50, deadline=None)
@given(
    st.integers(0, 10**5000 - 1) | st.integers(-(10**5000), 0),
    st.sampled_from(["+", "*", "<<", "/", "-"]),
)
def test_huge_numbers(number: int, op: str) -> None:
    text = str(number) if abs(number) < 10**4000 else "9" * 4500
    run(f"({op} {text} {text})")


def test_undecodable_byte_is_located(tmp_path: Path) -> None:
    path = tmp_path / "bad.policy"
    path.write_bytes(b"(+ 1 2)\n(+ 3 \xff)\n")
    (problem,) = check_files([path])
    assert str(problem) == "bad.policy:2:6: byte 0xff is not UTF-8"


def test_a_million_open_brackets_is_quick() -> None:
    try:
        parse("(" * 1_000_000, "f")
    except PolicyError as exc:
        assert "nesting" in exc.message
