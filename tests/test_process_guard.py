"""The guard of tests/process_guard.py, run on a small suite of its own: a test whose
process outlives it fails and the process is killed; processes of a
wider fixture, started during a test, are that fixture's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from process_guard import _alive

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from process_guard import install, no_process_outlives_its_test

def pytest_configure(config):
    install(config)
"""

SUITE = """
import subprocess
from pathlib import Path

import pytest

PIDS = Path(__file__).parent / "pids"


def note(pid):
    with PIDS.open("a") as f:
        f.write(f"{pid}\\n")


@pytest.fixture(scope="module")
def module_sleeper():
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def test_a_wider_fixture_starts_a_process_during_this_test(request):
    request.getfixturevalue("module_sleeper")


def test_stops_what_it_starts(module_sleeper):
    process = subprocess.Popen(["sleep", "300"])
    process.kill()
    process.wait()


def test_leaves_a_child():
    note(subprocess.Popen(["sleep", "300"]).pid)

"""


def test_a_process_that_outlives_its_test_fails_it_and_is_killed(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_suite.py").write_text(SUITE)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            "-rA",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert "PASSED test_suite.py::test_a_wider_fixture_starts_a_process_during_this_test" in out
    assert "PASSED test_suite.py::test_stops_what_it_starts" in out
    assert "ERROR test_suite.py::test_leaves_a_child" in out
    # Only the test that left its child is blamed; the summary line may repeat the
    # message or cut it, depending on the terminal width CI gives.
    assert out.count("ERROR at teardown of") == 1, out
    assert "ERROR at teardown of test_leaves_a_child" in out, out
    assert "3 passed, 1 error" in out, out
    assert "outlived it (killed now)" in out, out
    assert "sleep 300" in out
    left = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert len(left) == 1 and not any(_alive(pid) for pid in left)
