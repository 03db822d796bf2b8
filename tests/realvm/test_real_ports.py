"""The incoming migration ports of the private libvirtds: a block per test process, held
for its life, so that two test runs on one machine (CI jobs, developers) never give two
daemons the same range, the cause of QEMU's "Failed to find an available port"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from realvm_helpers import PORTS_PER_DAEMON, migration_port_min

pytestmark = [pytest.mark.realvm, pytest.mark.xdist_group("realvm")]

HERE = Path(__file__).resolve().parent
ASK = "from realvm_helpers import migration_port_min as m; print(m('a'), m('c'))"


def other_process(extra: str = "") -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", extra + ASK],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert done.returncode == 0, done.stderr
    a, c = done.stdout.split()
    return int(a), int(c)


def test_each_process_holds_its_own_block_of_ports() -> None:
    mine = migration_port_min("a")
    assert migration_port_min("b") == mine + PORTS_PER_DAEMON
    assert migration_port_min("a") == mine  # held, not chosen again
    theirs, their_last = other_process()
    # Their three ranges and ours do not overlap.
    assert theirs >= mine + 3 * PORTS_PER_DAEMON or their_last + PORTS_PER_DAEMON <= mine


def test_a_block_with_a_port_in_use_is_passed_over() -> None:
    mine = migration_port_min("a")
    # The other process listens in the block after ours before it asks.
    theirs, _ = other_process(
        f"import socket; s = socket.socket(); s.bind(('0.0.0.0', {mine + 100 + 5})); "
    )
    assert theirs not in (mine, mine + 100)
