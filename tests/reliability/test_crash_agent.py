"""kill -9 the host agent mid-cycle: nothing is journalled as applied that the hypervisor
does not hold, and a restarted agent carries on.

The hypervisor is libvirt's test driver served by a private ``libvirtd`` (its own socket
and config in a temporary directory, no other driver loaded), reached by the agent as
``test+unix:///default?socket=...``. The guests' state lives in the daemon and outlives
every agent the test kills; the test's own connection keeps it alive, since the daemon
frees the shared default host with its last connection.

The policy moves every guest's balloon one step round three sizes each cycle, so every
cycle applies a control to every guest (a long controller phase to kill the agent in),
and the value a cycle wanted follows from the value before it. Three sizes, not two, so
that a hypervisor one step ahead of the journal (allowed: killed between a call and its
record) cannot be mistaken for a journal ahead of the hypervisor (never allowed).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest
from libvirt_daemons import test_driver_daemon

from loadmaster.agent.sla.journal import JOURNAL_FILE, read_journal

LOADMASTER = str(Path(sys.executable).parent / "loadmaster")
GUESTS = 200
MEMORY_KIB = 4 * 1024 * 1024
STEP_KIB = 64 * 1024
CONTROL = "balloon_target"
MID_CYCLE_KILLS = 6
MAX_ROUNDS = 14
WAIT_S = 30.0

ROTATE_POLICY = f"""
(defvar step {STEP_KIB})
(with Guests guest
    (guest.Control "balloon_target"
        (if (== guest.balloon_cur guest.balloon_max)
            (- guest.balloon_max step)
            (if (== guest.balloon_cur (- guest.balloon_max step))
                (- guest.balloon_max (* 2 step))
                guest.balloon_max))))
"""

GUEST_XML = """<domain type="test">
  <name>{name}</name>
  <memory>{memory}</memory>
  <currentMemory>{memory}</currentMemory>
  <vcpu>1</vcpu>
  <memtune><min_guarantee>{minimum}</min_guarantee></memtune>
  <os><type>hvm</type></os>
</domain>"""

Balloons = dict[str, tuple[int, int]]
"""uuid -> (current, maximum) KiB, as the hypervisor holds them."""


def rotate(current: int, maximum: int) -> int:
    """What the policy asks for a guest whose balloon is at ``current``."""
    if current == maximum:
        return maximum - STEP_KIB
    if current == maximum - STEP_KIB:
        return maximum - 2 * STEP_KIB
    return maximum


@pytest.fixture
def daemon_uri(tmp_path: Path) -> Iterator[str]:
    """A private libvirtd serving the test driver; its URI for the agent."""
    with test_driver_daemon(tmp_path / "libvirtd") as uri:
        yield uri


def balloons(conn: Any) -> Balloons:
    found = {}
    for dom in conn.listAllDomains():
        _state, maximum, current, *_ = dom.info()
        found[dom.UUIDString()] = (int(current), int(maximum))
    return found


class JournalTail:
    """Follows the journal as an agent writes it: how many controls the cycle it is in
    has journalled, None between cycles. Starts over when the file is replaced
    (compaction on open) or cut back (a torn record dropped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.inode: int | None = None
        self.offset = 0
        self.partial = b""
        self.in_cycle: int | None = None
        self.skip_to_end()

    def skip_to_end(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        self.inode, self.offset, self.partial, self.in_cycle = st.st_ino, st.st_size, b"", None

    def poll(self) -> int | None:
        try:
            with self.path.open("rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self.inode or st.st_size < self.offset:
                    self.inode, self.offset, self.partial, self.in_cycle = st.st_ino, 0, b"", None
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return None
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for line in lines:
            kind = json.loads(line)["kind"]
            if kind == "cycle-start":
                self.in_cycle = 0
            elif kind == "cycle-end":
                self.in_cycle = None
            elif kind == "applied" and self.in_cycle is not None:
                self.in_cycle += 1
        return self.in_cycle


def agent_command(uri: str, policy_dir: Path, state_dir: Path, *extra: str) -> list[str]:
    return [
        LOADMASTER,
        "agent",
        "--hypervisor",
        uri,
        "--policy-dir",
        str(policy_dir),
        "--interval",
        "0",
        "--host-name",
        "crash-host",
        "--state-dir",
        str(state_dir),
        *extra,
    ]


def kill_mid_cycle(command: list[str], tail: JournalTail, after: int, log: Path) -> None:
    """Start an agent and SIGKILL it once a cycle it started has journalled ``after``
    controls (it goes on working between that poll and the signal)."""
    tail.skip_to_end()
    with log.open("wb") as out:
        agent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + WAIT_S
    try:
        while (journalled := tail.poll()) is None or journalled < after:
            assert agent.poll() is None, f"the agent exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the agent never got that far into a cycle"
            time.sleep(0.001)
    finally:
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
    assert agent.returncode == -signal.SIGKILL


def check_after_kill(state_dir: Path, hypervisor: Balloons, initial: Balloons) -> tuple[bool, bool]:
    """The journal against the hypervisor after a kill; (killed mid-cycle, hypervisor
    one call ahead of the journal)."""
    state = read_journal(state_dir)  # parses, a torn last record left out
    journalled = {
        uuid: state.last[(uuid, CONTROL)].value if (uuid, CONTROL) in state.last else current
        for uuid, (current, _maximum) in initial.items()
    }
    ahead = {uuid for uuid, (current, _) in hypervisor.items() if current != journalled[uuid]}
    # The agent calls the hypervisor and records the call before its next one: only the
    # call in flight when it died can be missing from the journal, and nothing else.
    assert len(ahead) <= 1, {u: (journalled[u], hypervisor[u]) for u in ahead}
    for uuid in ahead:
        assert state.open_cycle is not None, "a value changed outside any journalled cycle"
        current, maximum = hypervisor[uuid]
        # The hypervisor holds what the interrupted cycle wanted for the value before it,
        # which the journal still shows: it is ahead of the journal, never behind.
        assert current == rotate(journalled[uuid], maximum), (journalled[uuid], current)
    return state.open_cycle is not None, bool(ahead)


def carry_on(command: list[str], conn: Any, state_dir: Path, after_mid_cycle_kill: bool) -> None:
    """One complete cycle of a restarted agent brings every guest where the policy wants
    it, and leaves the journal's last state equal to the hypervisor's."""
    before = balloons(conn)
    run = subprocess.run(
        [*command, "--cycles", "1"], capture_output=True, text=True, timeout=WAIT_S * 2
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"cycle 1: {len(before)} guests, {len(before)} actions, 0 failures" in run.stderr
    if after_mid_cycle_kill:
        assert "the previous agent stopped in cycle" in run.stderr
    after = balloons(conn)
    assert after == {u: (rotate(c, m), m) for u, (c, m) in before.items()}
    state = read_journal(state_dir)
    assert state.open_cycle is None
    assert {u: state.last[(u, CONTROL)].value for u in after} == {
        u: c for u, (c, _m) in after.items()
    }


def test_kill_nine_mid_cycle_journal_never_ahead_and_agent_carries_on(
    daemon_uri: str, tmp_path: Path
) -> None:
    conn = libvirt.open(daemon_uri)
    try:
        for i in range(GUESTS):
            conn.createXML(
                GUEST_XML.format(name=f"g{i:04d}", memory=MEMORY_KIB, minimum=MEMORY_KIB // 4), 0
            )
        initial = balloons(conn)
        assert len(initial) == GUESTS + 1  # the test driver's own "test" domain too
        policy_dir = tmp_path / "policy"
        policy_dir.mkdir()
        (policy_dir / "rotate.policy").write_text(ROTATE_POLICY)
        state_dir = tmp_path / "state"
        command = agent_command(daemon_uri, policy_dir, state_dir)
        tail = JournalTail(state_dir / JOURNAL_FILE)
        rng = random.Random(6)

        kills = mid_cycle = ahead = 0
        started = time.monotonic()
        while mid_cycle < MID_CYCLE_KILLS and kills < MAX_ROUNDS:
            # Kill somewhere in the first half of the controller phase, so the agent is
            # still inside that cycle when the signal lands even on a slow machine.
            kill_mid_cycle(command, tail, rng.randrange(GUESTS // 2), tmp_path / "agent.log")
            kills += 1
            was_mid_cycle, was_ahead = check_after_kill(state_dir, balloons(conn), initial)
            mid_cycle += was_mid_cycle
            ahead += was_ahead
            carry_on(command, conn, state_dir, was_mid_cycle)
        elapsed = time.monotonic() - started

        assert mid_cycle >= MID_CYCLE_KILLS, f"only {mid_cycle} of {kills} kills were mid-cycle"
        state = read_journal(state_dir)
        assert len(state.interrupted) >= MID_CYCLE_KILLS
        assert all(c.applied < GUESTS + 1 for c in state.interrupted)
        print(
            f"{kills} kills, {mid_cycle} mid-cycle, {ahead} with the hypervisor one call "
            f"ahead of the journal, {len(state.interrupted)} interrupted cycles journalled, "
            f"{elapsed:.1f} s"
        )
    finally:
        conn.close()
