"""No process a test starts outlives it.

A multi-worker ``loadmaster serve`` whose test failed once kept two workers answering on
127.0.0.1, without authentication, for 28 minutes. So every test is watched: a process
started while it ran (a descendant of this pytest process, xdist worker or not) that is
still alive when its fixtures are torn down is killed, and the test fails naming it.

What is not the test's: processes that were running before it started and everything
they start later (a module's server replacing a worker), and processes started while a
fixture of a wider scope was being set up (the session's PostgreSQL, the real-VM tests'
private libvirtd), even if that setup happened during this test.

A process whose parent dies escapes to init and out of sight. pytest is not made a child
subreaper to keep them: it would adopt the QEMU guests libvirtd daemonizes, and libvirtd
waits for a guest's pid to vanish, which a zombie nobody reaps never does (graceful stops
and removals hung 30 s). ``serve``'s workers die with their supervisor (PR_SET_PDEATHSIG),
so they cannot be left behind that way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Generator, Iterator
from multiprocessing import resource_tracker
from pathlib import Path

import pytest

# A process on its way out (its supervisor killed it, SIGTERM is being handled) is given
# this long to finish before it counts as left behind; generous for a loaded machine.
GRACE_S = 15.0
# Processes owned by fixtures wider than a test: their pids, and everything under them.
_owned: set[int] = set()


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process this pytest can see."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The command name may hold spaces and parentheses: split after the last ')'.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def _descendants(table: dict[int, tuple[int, str]], root: int) -> dict[int, list[int]]:
    """Each descendant of ``root`` -> its ancestors up to ``root``, nearest first."""
    found: dict[int, list[int]] = {}
    for pid in table:
        chain, parent = [], table[pid][0]
        while parent not in (root, 0, 1) and parent in table and len(chain) < 64:
            chain.append(parent)
            parent = table[parent][0]
        if parent == root and pid != root:
            found[pid] = chain
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _reap(pid: int) -> None:
    """Collect the exit status of a child the test left behind (a Popen never waited
    for), so it does not stay a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _describe(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        command = "?"
    return f"{pid} ({command.strip()[:200]})"


def _not_the_tests(pid: int, chain: list[int], before: set[int]) -> bool:
    return any(p in before or p in _owned for p in (pid, *chain))


class WiderFixtures:
    """A plugin: processes a session, package, module or class fixture starts are that
    fixture's. Registered with the plugin manager (``pytest_configure``), not defined in a
    conftest: a conftest's hooks are not called for session fixtures, set up on the
    session's node above the tests directory."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[object]
    ) -> Generator[None, object, object]:
        if fixturedef.scope == "function":
            return (yield)
        me = os.getpid()
        before = set(_descendants(_processes(), me))
        try:
            return (yield)
        finally:
            _owned.update(set(_descendants(_processes(), me)) - before)


def install(config: pytest.Config) -> None:
    # multiprocessing's resource tracker serves the whole pytest process once a test
    # first uses a spawn context; started now, it is the session's, not that test's.
    before = set(_descendants(_processes(), os.getpid()))
    resource_tracker.ensure_running()
    _owned.update(set(_descendants(_processes(), os.getpid())) - before)
    config.pluginmanager.register(WiderFixtures(), "process-guard")


@pytest.fixture(autouse=True)
def no_process_outlives_its_test() -> Iterator[None]:
    me = os.getpid()
    before = set(_descendants(_processes(), me))
    yield
    deadline = time.monotonic() + GRACE_S
    while True:
        table = _processes()
        left = sorted(
            pid
            for pid, chain in _descendants(table, me).items()
            if not _not_the_tests(pid, chain, before)
        )
        for pid in left:
            if table[pid][1] == "Z" and table[pid][0] == me:
                _reap(pid)
        left = [pid for pid in left if _alive(pid)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not left:
        return
    described = [_describe(pid) for pid in left]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in left:
        _reap(pid)
    pytest.fail(
        f"{len(left)} process(es) this test started outlived it (killed now): "
        + "; ".join(described),
        pytrace=False,
    )
