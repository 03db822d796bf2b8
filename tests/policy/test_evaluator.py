"""Every special form and operator with MOM's semantics, and each evaluation error's position."""

from __future__ import annotations

import logging

import pytest
from policy_helpers import error_of, guest, host, value_of

from loadmaster.policy import Policy, PolicyError
from loadmaster.policy.evaluator import MAX_DEPTH


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("(+ 1 2)", 3),
        ('(+ "a" "b")', "ab"),
        ("(- 5 7)", -2),
        ("(* 3 4)", 12),
        ('(* "ab" 2)', "abab"),
        ("(/ 11 2)", 5.5),
        ("(/ 6 2)", 3.0),
        ("(< 1 2)", True),
        ("(> 1 2)", False),
        ("(<= 2 2)", True),
        ("(>= 1 2)", False),
        ("(== 1 1.0)", True),
        ("(== 'a' \"a\")", True),
        ("(== nil nil)", True),
        ("(!= 1 2)", True),
        ("(<< 1 10)", 1024),
        ("(>> 1024 3)", 128),
        ("(and 1 2 3)", 3),
        ("(and 1 0 3)", 0),
        ("(or 0 nil 5)", 5),
        ("(or 0 nil)", None),
        ("(not 0)", True),
        ("(not 'x')", False),
        ("(min 3 1 2)", 1),
        ("(max 3 1 2)", 3),
        ("(abs -4)", 4),
        ("(null)", True),
        ("(null nil '')", True),
        ("(null nil 0)", False),
        ("(valid)", True),
        ("(valid 1 0 '')", True),
        ("(valid 1 nil)", False),
        ("(if 1 'yes' 'no')", "yes"),
        ("(if 0 'yes' 'no')", "no"),
        ("(if '' 'yes' 'no')", "no"),
        ("(if 0.0 'yes' 'no')", "no"),
        ("{1 2 3}", 3),
        ("(eval 1 2)", 2),
        ("(add 1 2)", 3),
        ("(lt 2 1)", False),
        ("(let ((a 1) (b (+ a 1))) (* a b))", 2),
        ("(let () 7)", 7),
        ("(let ((a 1)) 1 2 a)", 1),
        ("(let ((a 1) (a 2)) a)", 1),
        ("(def f (x) (* x 2)) (f 21)", 42),
        ("(defun f () 5) (f)", 5),
        ("(def f (x) 1)", "f"),
        ("(defvar a 1) (defvar a 2) a", 1),
        ("(defvar a 1) (defvar a 2)", 1),
        ("(defvar a 1) (set a 2) a", 2),
        ("(defvar a 1) (setq a 3)", 3),
        ("(debug 1 2 'last')", "last"),
    ],
)
def test_forms_and_operators(text: str, expected: object) -> None:
    value = value_of(text)
    assert value == expected
    assert type(value) is type(expected)


def test_if_evaluates_only_the_chosen_branch() -> None:
    assert value_of("(if 1 2 (undefined_thing))") == 2
    assert value_of("(if 0 (/ 1 0) 3)") == 3


def test_and_or_do_not_short_circuit() -> None:
    err = error_of("(defvar x nil) (and (valid x) (> x 1))")
    assert err.message.startswith("cannot apply > to nil and number 1")
    assert error_of("(or 1 (undefined))").message == "undefined function undefined"


def test_dynamic_scoping() -> None:
    assert value_of("(defvar y 5) (def g () y) (def h (y) (g)) (h 9)") == 9
    assert value_of("(defvar y 5) (def g () y) (g)") == 5


def test_arguments_are_bound_like_let_star() -> None:
    assert value_of("(defvar a 5) (def f (a b) b) (f 1 a)") == 1


def test_defvar_is_local_inside_functions_let_and_with_global_in_if_and_eval() -> None:
    assert value_of("(if 1 (defvar g 1) 0) {(defvar h 2)} (+ g h)") == 3
    assert error_of("(def f () (defvar inner 1)) (f) inner").message == "undefined symbol inner"
    assert error_of("(let () (defvar inner 1)) inner").message == "undefined symbol inner"


def test_defvar_in_an_inner_scope_shadows() -> None:
    assert value_of("(defvar a 1) (let ((b 0)) (defvar a 2) a)") == 2
    assert value_of("(defvar a 1) (let ((b 0)) (defvar a 2)) a") == 1


def test_set_finds_the_nearest_scope() -> None:
    assert value_of("(defvar a 1) (def f () (set a 5)) (f) a") == 5
    assert value_of("(defvar a 1) (let ((a 2)) (set a 9)) a") == 1


def test_def_inside_a_function_is_global_and_def_replaces() -> None:
    assert value_of("(def outer () (def inner () 7)) (outer) (inner)") == 7
    assert value_of("(def f () 1) (def f () 2) (f)") == 2


def test_builtins_shadow_functions_and_variables_shadow_builtins() -> None:
    assert value_of("(def max (a b) 42) (max 1 2)") == 2
    err = error_of("(defvar f 3) (def f () 1) (f)")
    assert (err.column, err.message) == (28, "f is not a function (it is number 3)")


def test_with_iterates_guests_and_returns_results() -> None:
    guests = [guest("a", x=1), guest("b", x=2)]
    assert value_of("(with Guests g (* g.x 10))", guests=guests) == [10, 20]
    assert value_of("(with Guests g (g.Prop 'name'))", guests=guests) == ["a", "b"]
    assert value_of("(with Guests g 1)") == []


def test_with_binds_the_item_in_its_own_scope() -> None:
    guests = [guest("a", x=1)]
    err = error_of("(with Guests g 1) g", guests=guests)
    assert err.message == "undefined symbol g"


def test_dotted_lookup_skips_scopes_without_the_attribute() -> None:
    # The inner "g" is a number without attribute x: MOM keeps looking outward.
    guests = [guest("a", x=1)]
    assert value_of("(with Guests g (let ((g 5)) g.x))", guests=guests) == [1]


def test_misnamed_parameter_works_through_dynamic_scope() -> None:
    # The parameter is "vm"; the body reads "guest", the caller's with-variable (MOM's
    # dynamic scope). Deployed MOM policies have relied on this by accident.
    text = """
    (def raise_small (vm) (if (< guest.balloon_cur 10) (guest.Control "t" 1) 0))
    (with Guests guest (raise_small guest))
    (with Guests guest (guest.GetControl "t"))
    """
    assert value_of(text, guests=[guest("a", balloon_cur=5), guest("b", balloon_cur=50)]) == [
        1,
        None,
    ]


def test_entity_api() -> None:
    h = host(history=[{"mem_free": 10}, {"mem_free": None}, {"mem_free": 20}], mem_free=20)
    g = guest("vm", tags=["gold", "compute"], properties={"uuid": "u-1"}, balloon_cur=7)
    assert value_of('(Host.StatAvg "mem_free")', h) == 15.0
    assert value_of("Host.mem_free", h) == 20
    assert value_of('(Host.Stat "mem_free")', h) == 20
    assert value_of("Host.swap_total", h) is None  # declared by MOM, not collected
    assert value_of('(Host.StatAvg "swap_total")', h) == 0.0
    assert value_of('(with Guests g (g.Prop "uuid"))', guests=[g]) == ["u-1"]
    assert value_of('(with Guests g (g.Prop "nothing"))', guests=[g]) == [None]
    assert value_of('(with Guests g (g.HasTag "gold"))', guests=[g]) == [True]
    assert value_of('(with Guests g (g.HasTag "silver"))', guests=[g]) == [False]
    assert value_of("(with Guests g (g.Tags))", guests=[g]) == [["compute", "gold"]]
    text = '(Host.Control "c" 3) (Host.SetVar "v" 4) (+ (Host.GetControl "c") (Host.GetVar "v"))'
    assert value_of(text) == 7
    assert value_of('(Host.GetControl "unset")') is None
    assert value_of('(Host.Control "c" 1)') is None


def test_stat_avg_without_history_uses_the_latest_sample() -> None:
    assert value_of('(Host.StatAvg "mem_free")', host(mem_free=8)) == 8.0


def test_io_tune_entries() -> None:
    entry = {
        "name": "vda",
        "path": "/dev/vda",
        # Every limit key must be present (null: no limit); see test_incomplete_samples.
        "maximum": {
            "total_bytes_sec": 100,
            "read_bytes_sec": None,
            "write_bytes_sec": None,
            "total_iops_sec": None,
            "read_iops_sec": 7,
            "write_iops_sec": None,
        },
        "current": {"total_bytes_sec": 0},
    }
    g = guest("vm", properties={"io_tune": [entry]})
    text = """
    (with Guests g (with g.io_tune t {
        (defvar m t.maximum)
        (t.setTotalBytesSec m.total_bytes_sec)
        (t.setReadIopsSec 7.9)
        t.name
    }))
    """
    assert value_of(text, guests=[g]) == [["vda"]]
    result = Policy.from_text(text).evaluate(host(), [g])
    request = result.guest_controls["vm"]["io_tune"]
    assert request == [
        {
            "name": "vda",
            "path": "/dev/vda",
            "ioTune": {
                "total_bytes_sec": 100,
                "read_bytes_sec": None,
                "write_bytes_sec": None,
                "total_iops_sec": None,
                "read_iops_sec": 7,
                "write_iops_sec": None,
            },
        }
    ]


def test_unchanged_io_tune_sends_nothing() -> None:
    g = guest("vm", properties={"io_tune": [{"name": "vda", "current": {"total_bytes_sec": 5}}]})
    text = "(with Guests g (with g.io_tune t (t.setTotalBytesSec 5)))"
    assert Policy.from_text(text).evaluate(host(), [g]).guest_controls == {}


def test_debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="loadmaster.policy"):
        value_of("(debug 'hello' 3)")
    assert "debug: ('hello', 3)" in caplog.text


# -- errors, each with its position -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("foo", 1, 1, "undefined symbol foo"),
        ("(+ 1\n   foo)", 2, 4, "undefined symbol foo"),
        ("(if 1 2)", 1, 1, "if needs an else branch: (if condition then else)"),
        ("(if 1 2 3 4)", 1, 1, "if takes exactly 3 argument(s), got 4"),
        ("(- 1)", 1, 1, "sub takes exactly 2 argument(s), got 1"),
        ("(+ 1 2 3)", 1, 1, "add takes exactly 2 argument(s), got 3"),
        ("(and)", 1, 1, "and takes at least 1 argument(s), got 0"),
        ("(min)", 1, 1, "min takes at least 1 argument(s), got 0"),
        ("(not 1 2)", 1, 1, "not takes exactly 1 argument(s), got 2"),
        ("{}", 1, 1, "eval takes at least 1 argument(s), got 0"),
        ("(debug)", 1, 1, "debug takes at least 1 argument(s), got 0"),
        ("(abs 1 2)", 1, 1, "abs takes 1 argument(s), got 2"),
        ("()", 1, 1, "empty expression ()"),
        ("(1 2)", 1, 2, "a number cannot be called; expected a name"),
        ('("f" 2)', 1, 2, "a string cannot be called; expected a name"),
        ("((f) 2)", 1, 2, "a list cannot be called; expected a name"),
        ("(+ + 1)", 1, 4, "operator + used as a value"),
        ("(nothing 1)", 1, 2, "undefined function nothing"),
        ("(set undeclared 1)", 1, 6, "undefined symbol undeclared (set needs a defvar first)"),
        ("(defvar 1 2)", 1, 9, "defvar expects a name here"),
        ("(def f x 1)", 1, 8, "def f: parameters must be a list of names"),
        ("(def f (1) 1)", 1, 8, "def f: parameters must be a list of names"),
        ("(def f (a) a) (f)", 1, 15, "function f takes 1 argument(s), got 0"),
        ("(def f (a) a) (f 1 2)", 1, 15, "function f takes 1 argument(s), got 2"),
        ("(let x 1)", 1, 6, "let expects a list of (name value) bindings"),
        ("(let ((a)) 1)", 1, 7, "let binding must be (name value)"),
        ("(let ((a 1)))", 1, 1, "let takes at least 2 argument(s), got 1"),
        ("(with Nope g 1)", 1, 7, "undefined symbol Nope"),
        ("(defvar n nil) (with n g 1)", 1, 22, "with: n is nil, not a list"),
        ("(with (f) g 1)", 1, 7, "with expects the name of a list here"),
        ("(/ 1 0)", 1, 1, "division by zero"),
        ("(/ 1.5 0.0)", 1, 1, "division by zero"),
        ("(< nil 1)", 1, 1, "cannot apply < to nil and number 1 ("),
        ("(< 'a' 1)", 1, 1, "cannot apply < to string 'a' and number 1 ("),
        ("(+ 1 'a')", 1, 1, "cannot apply + to number 1 and string 'a' ("),
        ("(<< 1.0 2)", 1, 1, "cannot apply << to number 1.0 and number 2 ("),
        ("(<< 1 -1)", 1, 1, "cannot apply << to number 1 and number -1 ("),
        ("(abs 'x')", 1, 1, "abs needs a number, got string 'x'"),
        ("(min 1 'a')", 1, 1, "min: '<' not supported between instances of 'str' and 'int'"),
        ("0o9", 1, 1, "invalid octal literal 0o9"),
        ("(defvar x 1) x.real", 1, 14, "undefined symbol x.real"),
        ("Host.a.b", 1, 1, "Host.a.b: only one level of attribute access is supported"),
        ("Host.no_such_stat", 1, 1, "undefined symbol Host.no_such_stat"),
        ('(Host.Stat "nope")', 1, 1, "host has no stat 'nope'"),
        ("(Host.StatAvg 3)", 1, 1, "stat name must be a string, got number 3"),
        ('(Host.Control "c")', 1, 1, "host.Control takes 2 argument(s), got 1"),
        (
            '(Host.Control "c" Host)',
            1,
            1,
            "control 'c' must be a number, string or nil, got <entity host>",
        ),
        ('(Host.Control "c" 1e999)', 1, 1, "control 'c' is not a finite number: inf"),
        ("(Host.Control 3 1)", 1, 1, "control name must be a string, got number 3"),
        ('(* "ab" 10000000000)', 1, 1, "result longer than 100000 items"),
        ("(<< 1 100000000000)", 1, 1, "integer result exceeds 4096 bits"),
        ("(/ " + "9" * 400 + " 1)", 1, 1, "cannot apply / to number"),
    ],
)
def test_evaluation_errors_have_positions(text: str, line: int, column: int, message: str) -> None:
    err = error_of(text)
    assert (err.file, err.line, err.column) == ("t.policy", line, column)
    assert err.message.startswith(message)


def test_runaway_recursion_is_a_policy_error() -> None:
    err = error_of("(def f () (f))\n(f)")
    assert f"nested deeper than {MAX_DEPTH}" in err.message
    assert err.line == 1


def test_mutual_recursion_through_arguments() -> None:
    err = error_of("(def f (x) (f (+ x 1))) (f 0)")
    assert "nested deeper" in err.message


def test_exponential_work_hits_the_step_budget() -> None:
    text = "(def f (n) (if (> n 0) {(f (- n 1)) (f (- n 1))} 0)) (f 30)"
    with pytest.raises(PolicyError, match="exceeded 5000 steps"):
        Policy(Policy.from_text(text).files, max_steps=5000).evaluate(host(), [])


def test_repeated_squaring_stops_at_the_integer_cap() -> None:
    err = error_of("(def sq (x n) (if (> n 0) (sq (* x x) (- n 1)) x)) (sq 3 100)")
    assert "exceeds 4096 bits" in err.message


def test_error_deep_inside_a_function_points_at_the_failing_expression() -> None:
    text = "(def f (g)\n  (+ g.balloon_cur\n     g.nope))\n(with Guests x (f x))"
    err = error_of(text, guests=[guest("a", balloon_cur=1)])
    assert (err.line, err.column, err.message) == (3, 6, "undefined symbol g.nope")
