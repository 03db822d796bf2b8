"""No writes to the real host by accident: with the libvirt test driver or the simulator,
KSM changes never reach this machine's /sys, and an explicit sys root gets them."""

from __future__ import annotations

import builtins
import io
import os
import pathlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loadmaster.agent import run_agent
from loadmaster.agent.hypervisor.base import (
    DEFAULT_SYS_ROOT,
    HypervisorError,
    MemoryKsm,
    SysfsKsm,
    is_test_driver,
    ksm_for,
)
from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor
from loadmaster.agent.hypervisor.simulated import SimulatedHypervisor
from loadmaster.agent.sla import Agent
from loadmaster.agent.sla.simulated import simulated_agent
from loadmaster.policy import shipped_policy_dir

REAL_KSM = Path("/sys/kernel/mm/ksm")
# Far from the values a kernel boots with, so a write that got through would show.
KSM_POLICY = """
(Host.Control "ksm_run" 1)
(Host.Control "ksm_pages_to_scan" 4321)
(Host.Control "ksm_sleep_millisecs" 77)
"""


class SysWriteGuard:
    """Refuses, and remembers, every attempt to open a file under /sys for writing."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def check(self, path: Any, writing: bool) -> None:
        # An int is an already open descriptor: its opening was checked.
        name = os.fsdecode(os.fspath(path)) if isinstance(path, str | bytes | os.PathLike) else ""
        if writing and os.path.abspath(name).startswith("/sys/"):
            self.attempts.append(name)
            raise PermissionError(f"test guard: write to {name} refused")

    def wrap_open(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            self.check(file, any(c in mode for c in "wax+"))
            return real(file, mode, *args, **kwargs)

        return guarded

    def wrap_os_open(self, real: Callable[..., int]) -> Callable[..., int]:
        def guarded(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC)
            self.check(path, bool(writing))
            return real(path, flags, *args, **kwargs)

        return guarded


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[SysWriteGuard]:
    g = SysWriteGuard()
    monkeypatch.setattr(builtins, "open", g.wrap_open(builtins.open))
    monkeypatch.setattr(io, "open", g.wrap_open(io.open))
    monkeypatch.setattr(os, "open", g.wrap_os_open(os.open))
    # Path.write_text and friends go through Path.open, which calls its own io.open.
    monkeypatch.setattr(pathlib.Path, "open", g.wrap_open(pathlib.Path.open))
    yield g


def real_ksm_files() -> dict[str, str]:
    if not REAL_KSM.is_dir():
        return {}
    files = {}
    for path in sorted(REAL_KSM.iterdir()):
        try:
            files[path.name] = path.read_text()
        except OSError:
            continue
    return files


def test_the_guard_catches_a_write_to_the_real_sysfs(guard: SysWriteGuard) -> None:
    # Without this, the tests below would prove nothing: a SysfsKsm on the real root
    # is refused by the guard, and seen.
    with pytest.raises(HypervisorError, match="test guard"):
        SysfsKsm(DEFAULT_SYS_ROOT).write("pages_to_scan", 4321)
    assert guard.attempts == ["/sys/kernel/mm/ksm/pages_to_scan"]


@pytest.mark.parametrize(
    ("uri", "test_driver"),
    [
        ("test:///default", True),
        ("test+unix:///default", True),
        ("qemu:///system", False),
        ("qemu+ssh://host/system", False),
        ("testing:///x", False),
    ],
)
def test_which_uris_are_the_test_driver(uri: str, test_driver: bool) -> None:
    assert is_test_driver(uri) == test_driver


def test_ksm_root_by_driver(tmp_path: Path) -> None:
    assert isinstance(ksm_for("test:///default", None), MemoryKsm)
    explicit = ksm_for("test:///default", tmp_path)
    assert isinstance(explicit, SysfsKsm) and explicit.directory == tmp_path / "kernel/mm/ksm"
    real = ksm_for("qemu:///system", None)
    assert isinstance(real, SysfsKsm) and real.directory == REAL_KSM


def test_agent_on_the_test_driver_never_writes_the_real_ksm(
    tmp_path: Path, guard: SysWriteGuard
) -> None:
    before = real_ksm_files()
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    (policy_dir / "50-ksm.policy").write_text(KSM_POLICY)
    reports = run_agent("test:///default", policy_dir, 0.0, None, None, "h1", cycles=2)
    applied = {a.control: a.value for a in reports[0].actions if a.controller == "ksm"}
    # The policy's KSM settings were applied, to the test host's in-memory KSM.
    assert applied == {"ksm_pages_to_scan": 4321, "ksm_sleep_millisecs": 77, "ksm_run": 1}
    assert reports[0].failures == []
    assert [a for a in reports[1].actions if a.controller == "ksm"] == []
    assert guard.attempts == []
    assert real_ksm_files() == before


def test_an_explicit_sys_root_gets_the_writes(tmp_path: Path, guard: SysWriteGuard) -> None:
    root = tmp_path / "sys"
    (root / "kernel/mm/ksm").mkdir(parents=True)
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    (policy_dir / "50-ksm.policy").write_text(KSM_POLICY)
    run_agent("test:///default", policy_dir, 0.0, None, None, "h1", cycles=1, sys_root=root)
    assert (root / "kernel/mm/ksm/pages_to_scan").read_text() == "4321\n"
    assert (root / "kernel/mm/ksm/run").read_text() == "1\n"
    assert guard.attempts == []


def test_the_shipped_policies_on_the_test_driver_and_the_simulator_leave_sys_alone(
    tmp_path: Path, guard: SysWriteGuard
) -> None:
    before = real_ksm_files()
    hv = LibvirtHypervisor("test:///default")
    try:
        report = Agent(hv, shipped_policy_dir(), host_name="h1").run_cycle()
    finally:
        hv.close()
    assert report.policy_error is None
    sim = SimulatedHypervisor.mixed(12, seed=3, ramp_steps=5)
    agent = simulated_agent(sim, shipped_policy_dir())
    for _ in range(10):
        sim.advance()
        agent.run_cycle()
    # Memory pressure made the shipped KSM policy write the simulator's KSM.
    assert ("run", 1) in sim.ksm_writes
    assert guard.attempts == []
    assert real_ksm_files() == before
