"""Issue #13, defect 1: every cycle is bounded in steps, memory and wall time, and only
regular files are read from a policy directory, so no policy text can hang or crash."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from policy_helpers import guest, host

from loadmaster.policy import Policy, PolicyError, load_policy_dir
from loadmaster.policy.engine import PolicyDirectory
from loadmaster.policy.errors import PolicyLimitError
from loadmaster.policy.evaluator import MAX_SEQUENCE


def limit_error(text: str, **bounds: float) -> PolicyLimitError:
    policy = Policy(Policy.from_text(text, "x.policy").files, **bounds)  # type: ignore[arg-type]
    with pytest.raises(PolicyLimitError) as info:
        policy.evaluate(host(), [])
    return info.value


# -- steps: with counts every iteration, whatever it iterates over -------------------


@pytest.mark.parametrize(
    ("text", "position"),
    [
        # Numbers and names as the body cost no step of their own.
        ('(defvar s (* "x" 1000))\n(with s a (with s b 0))', (2, 12)),
        ('(defvar s (* "x" 1000))\n(with s a (with s b b))', (2, 12)),
        ('(defvar s (* "x" 1000))\n(with s a (with s b "y"))', (2, 12)),
    ],
)
def test_with_counts_a_step_for_every_iteration(text: str, position: tuple[int, int]) -> None:
    # A million iterations in a 10,000-step budget; before, only ~2,000 were counted.
    err = limit_error(text, max_steps=10_000)
    assert (err.file, err.line) == ("x.policy", position[0])
    assert err.message == "evaluation exceeded 10000 steps"


def test_the_reported_hang_ends_within_seconds() -> None:
    # The program, at the largest string the memory bound allows: 10^10 iterations.
    # Run apart, so that a regression fails here instead of hanging the suite.
    code = (
        "from loadmaster.policy import Policy\n"
        "from loadmaster.policy.errors import PolicyLimitError\n"
        "from loadmaster.policy.snapshot import EntitySnapshot\n"
        f"text = '(defvar s (* \"x\" {MAX_SEQUENCE})) (with s a (with s b 0))'\n"
        "try:\n"
        "    Policy.from_text(text, 'x.policy').evaluate(EntitySnapshot('h', {}), [])\n"
        "except PolicyLimitError as exc:\n"
        "    print(exc)\n"
    )
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith("x.policy:1:")
    assert "exceeded" in out.stdout
    assert time.monotonic() - started < 30


def test_wall_time_is_bounded_even_within_the_step_budget() -> None:
    started = time.monotonic()
    err = limit_error(
        '(defvar s (* "x" 100000))\n(with s a (with s b 0))', max_steps=10**12, max_seconds=0.2
    )
    assert time.monotonic() - started < 5
    assert err.message == "evaluation exceeded 0.2 s"
    assert (err.file, err.line) == ("x.policy", 2)


# -- memory: string and list sizes, and what one cycle builds in total -----------------


@pytest.mark.parametrize(
    "text",
    [
        '(* "x" 1000000)',
        '(* 1000000 "x")',
        '(defvar s (* "x" 60000))\n(+ s s)',
    ],
)
def test_a_string_over_the_bound_is_refused(text: str) -> None:
    err = limit_error(text)
    assert err.message == f"result longer than {MAX_SEQUENCE} items or characters"
    assert err.file == "x.policy" and err.line >= 1 and err.column >= 1


def test_what_one_cycle_builds_is_bounded() -> None:
    # Each string is allowed, but with keeps them all: 200 x 50,000 characters.
    text = '(defvar s (* "x" 200))\n(defvar big (* "y" 50000))\n(with s a (+ big "z"))'
    err = limit_error(text)
    assert err.message.startswith("evaluation built more than")
    assert (err.file, err.line, err.column) == ("x.policy", 3, 11)


def test_nested_with_results_are_bounded_in_memory() -> None:
    # The 3.3 GB variant: lists of lists of with results.
    text = '(defvar s (* "x" 3000))\n(with s a (with s b b))'
    # Unbounded in time, so a busy machine cannot make the wall-time bound trip first.
    err = limit_error(text, max_steps=10**9, max_seconds=1e9)
    assert err.message.startswith("evaluation built more than")


def test_a_limit_error_is_a_policy_error_and_survives_pickling() -> None:
    import pickle

    err = limit_error('(* "x" 1000000)')
    assert isinstance(err, PolicyError)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is PolicyLimitError and str(again) == str(err)


def test_guests_keep_working_under_the_bounds() -> None:
    g = guest("vm", balloon_cur=1)
    result = Policy.from_text('(with Guests g (g.Control "balloon_target" 2))').evaluate(
        host(), [g]
    )
    assert result.guest_controls == {"vm": {"balloon_target": 2}}


# -- files: only regular files are read, never blocking --------------------------------


def _unblock(path: Path) -> None:
    # A reader blocked on the FIFO (the bug) gets end-of-file once a writer comes and goes.
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def _within(seconds: float, fn: object) -> object:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())  # type: ignore[operator]
        except Exception as exc:  # the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome[0] if outcome else None


def test_a_fifo_named_x_policy_is_refused_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "a.policy").write_text('(Host.Control "ksm_run" 1)')
    fifo = tmp_path / "x.policy"
    os.mkfifo(fifo)
    try:
        result = _within(5, lambda: load_policy_dir(tmp_path))
        assert isinstance(result, PolicyError), "loading blocked on the FIFO"
        assert str(result) == "x.policy: not a regular file; refused"

        directory = PolicyDirectory(tmp_path)
        assert _within(5, directory.reload) is True, "reloading blocked on the FIFO"
        assert sorted(directory.running) == ["a.policy"]
        assert str(directory.errors["x.policy"]) == "x.policy: not a regular file; refused"
        assert directory.policy.evaluate(host(), []).host_controls == {"ksm_run": 1}
    finally:
        _unblock(fifo)


def test_a_directory_named_like_a_policy_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d.policy").mkdir()
    directory = PolicyDirectory(tmp_path)
    directory.reload()
    assert str(directory.errors["d.policy"]) == "d.policy: not a regular file; refused"


# -- per file: one bad file never stops the others, its previous version stays ---------


def test_a_file_over_a_bound_falls_back_to_its_last_version_that_ran(tmp_path: Path) -> None:
    site = tmp_path / "20-site.policy"
    (tmp_path / "10-base.policy").write_text('(Host.Control "ksm_run" 1)')
    site.write_text('(Host.Control "ksm_pages_to_scan" 64)')
    directory = PolicyDirectory(tmp_path, max_steps=10_000)
    directory.reload()
    assert directory.policy.evaluate(host(), []).host_controls["ksm_pages_to_scan"] == 64
    directory.cycle_succeeded()

    site.write_text('(defvar s (* "x" 1000))\n(with s a (with s b 0))')
    assert directory.reload() is True
    with pytest.raises(PolicyLimitError) as info:
        directory.policy.evaluate(host(), [])
    assert directory.reject(info.value) is True
    assert directory.policy.evaluate(host(), []).host_controls == {
        "ksm_run": 1,
        "ksm_pages_to_scan": 64,
    }
    assert str(directory.errors["20-site.policy"]).startswith("20-site.policy:2:")
    # The refused version is not tried again while the file is unchanged.
    assert directory.reload() is False
    assert "20-site.policy" in directory.errors


def test_a_new_file_over_a_bound_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "10-base.policy").write_text('(Host.Control "ksm_run" 1)')
    (tmp_path / "20-new.policy").write_text('(defvar s (* "x" 1000))\n(with s a (with s b 0))')
    directory = PolicyDirectory(tmp_path, max_steps=10_000)
    directory.reload()
    with pytest.raises(PolicyLimitError) as info:
        directory.policy.evaluate(host(), [])
    assert directory.reject(info.value) is True
    assert sorted(directory.running) == ["10-base.policy"]
    assert directory.policy.evaluate(host(), []).host_controls == {"ksm_run": 1}
