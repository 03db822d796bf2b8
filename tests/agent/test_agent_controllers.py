"""Controllers: changed values only, applied only after success, libvirt-safe values,
KSM's unmerge-first sequence, and isolation of failures."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from loadmaster.agent.hypervisor.base import QUOTA_MAX, GuestInfo, HypervisorError, SysfsKsm
from loadmaster.agent.hypervisor.simulated import GIB, SimGuestSpec, SimulatedHypervisor
from loadmaster.agent.sla.controllers import ControlContext, stop_or_migrate
from loadmaster.agent.sla.controllers.balloon import BalloonController
from loadmaster.agent.sla.controllers.cputune import (
    CpuTuneController,
    libvirt_period,
    libvirt_quota,
    libvirt_shares,
)
from loadmaster.agent.sla.controllers.iotune import IoTuneController
from loadmaster.agent.sla.controllers.ksm import KsmController
from loadmaster.agent.sla.controllers.migrate import MigrationController
from loadmaster.agent.sla.controllers.stop import StopController
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot

KSM_HOST = {"ksm_run": 1, "ksm_merge_across_nodes": 1, "ksm_pages_to_scan": 100}


def two_guests() -> SimulatedHypervisor:
    return SimulatedHypervisor(
        [
            SimGuestSpec("be", 4 * GIB, GIB, tags=frozenset({"best-effort"})),
            SimGuestSpec("gold", 4 * GIB, GIB, tags=frozenset({"gold"})),
        ],
        host_memory_kib=16 * GIB,
    )


def context(
    hv: SimulatedHypervisor,
    guest_controls: Mapping[str, Mapping[str, Any]] | None = None,
    host_controls: Mapping[str, Any] | None = None,
    host_stats: Mapping[str, Any] | None = None,
) -> ControlContext:
    guests = {g.name: g for g in hv.list_guests()}
    snapshots = {}
    for g in guests.values():
        info, tune = hv.balloon_info(g.uuid), hv.cpu_tune(g.uuid)
        stats = {
            "balloon_cur": info.current,
            "balloon_max": info.maximum,
            "balloon_min": info.minimum,
            "vcpu_quota": tune.quota,
            "vcpu_period": tune.period,
            "vcpu_shares": tune.shares,
        }
        snapshots[g.name] = EntitySnapshot(g.name, stats, tags=g.tags)
    host = EntitySnapshot("host", dict(host_stats or {}))
    result = CycleResult(dict(host_controls or {}), dict(guest_controls or {}))
    return ControlContext(result, host, guests, snapshots)


def uuid_of(hv: SimulatedHypervisor, name: str) -> str:
    return next(g.uuid for g in hv.list_guests() if g.name == name)


class RecordingKsm:
    """Writes to a fixture sysfs folder and remembers the order of the writes."""

    def __init__(self, sys_dir: Path, fail_on: tuple[str, int] | None = None) -> None:
        self.sysfs = SysfsKsm(sys_dir)
        self.writes: list[tuple[str, int]] = []
        self.fail_on = fail_on

    def ksm_write(self, key: str, value: int) -> None:
        if (key, value) == self.fail_on:
            raise HypervisorError(f"{key}: Device or resource busy")
        self.sysfs.write(key, value)
        self.writes.append((key, value))


def test_ksm_merge_change_unmerges_first(sys_dir: Path) -> None:
    hv = RecordingKsm(sys_dir)
    ctl = KsmController(hv)  # type: ignore[arg-type]
    ctx = context(two_guests(), host_controls={"ksm_merge_across_nodes": 0, "ksm_run": 1})
    ctx = ControlContext(ctx.result, EntitySnapshot("host", KSM_HOST), ctx.guests, ctx.snapshots)
    outcome = ctl.apply(ctx)
    assert hv.writes == [("run", 2), ("merge_across_nodes", 0), ("run", 1)]
    assert [a.control for a in outcome.actions] == ["ksm_run", "ksm_merge_across_nodes", "ksm_run"]
    ksm = sys_dir / "kernel/mm/ksm"
    assert (ksm / "merge_across_nodes").read_text() == "0\n"
    assert (ksm / "run").read_text() == "1\n"
    # Nothing changed since: nothing written.
    hv.writes.clear()
    assert ctl.apply(ctx).actions == []
    assert hv.writes == []


def test_ksm_merge_is_not_written_when_the_unmerge_fails(sys_dir: Path) -> None:
    hv = RecordingKsm(sys_dir, fail_on=("run", 2))
    ctl = KsmController(hv)  # type: ignore[arg-type]
    ctx = context(two_guests(), host_controls={"ksm_merge_across_nodes": 0})
    ctx = ControlContext(ctx.result, EntitySnapshot("host", KSM_HOST), ctx.guests, ctx.snapshots)
    outcome = ctl.apply(ctx)
    assert hv.writes == []
    assert len(outcome.failures) == 1
    assert (sys_dir / "kernel/mm/ksm/merge_across_nodes").read_text() == "1\n"


def test_simulated_kernel_refuses_merge_change_while_pages_are_shared() -> None:
    sim = two_guests()
    sim.ksm.update(run=1, pages_shared=10, pages_sharing=40)
    with pytest.raises(HypervisorError, match="busy"):
        sim.ksm_write("merge_across_nodes", 0)
    host = {f"ksm_{k}": v for k, v in sim.ksm_read().items()}
    ctx = context(sim, host_controls={"ksm_merge_across_nodes": 0, "ksm_pages_to_scan": 300})
    ctx = ControlContext(ctx.result, EntitySnapshot("host", host), ctx.guests, ctx.snapshots)
    outcome = KsmController(sim).apply(ctx)
    assert outcome.failures == []
    assert sim.ksm_writes == [
        ("run", 2),
        ("merge_across_nodes", 0),
        ("run", 1),
        ("pages_to_scan", 300),
    ]


def test_ksm_only_writes_values_that_differ_from_the_sampled_ones(sys_dir: Path) -> None:
    hv = RecordingKsm(sys_dir)
    ctx = context(two_guests(), host_controls={"ksm_run": 1.0, "ksm_pages_to_scan": 164.9})
    ctx = ControlContext(ctx.result, EntitySnapshot("host", KSM_HOST), ctx.guests, ctx.snapshots)
    KsmController(hv).apply(ctx)  # type: ignore[arg-type]
    assert hv.writes == [("pages_to_scan", 164)]


@pytest.mark.parametrize(
    ("policy_value", "sent"),
    [
        (-1, -1),
        (-1.0, -1),
        (0, -1),
        (-50_000, -1),
        (1, 1000),
        (999.9, 1000),
        (1000, 1000),
        (33_333.33, 33_333),
        (QUOTA_MAX, QUOTA_MAX),
        (10**20, QUOTA_MAX),
    ],
)
def test_quota_sent_is_one_libvirt_accepts(policy_value: float, sent: int) -> None:
    assert libvirt_quota(policy_value) == sent


@pytest.mark.parametrize(
    ("policy_value", "sent"), [(0, 1000), (999, 1000), (100_000, 100_000), (5e6, 1_000_000)]
)
def test_period_is_clamped(policy_value: float, sent: int) -> None:
    assert libvirt_period(policy_value) == sent


def test_shares_are_clamped() -> None:
    assert (libvirt_shares(0), libvirt_shares(1024), libvirt_shares(10**7)) == (2, 1024, 262_144)


def test_cpu_reset_and_odd_values_are_accepted_by_the_simulated_libvirt_checks() -> None:
    sim = two_guests()
    ctl = CpuTuneController(sim)
    ctx = context(sim, {"be": {"vcpu_quota": 250.5, "vcpu_period": 10}})
    assert ctl.apply(ctx).failures == []
    assert sim.cpu_tune(uuid_of(sim, "be")).quota == 1000
    assert sim.cpu_tune(uuid_of(sim, "be")).period == 1000
    # The policies' reset: quota -1, period 100000; then shares.
    outcome = ctl.apply(context(sim, {"be": {"vcpu_quota": -1, "vcpu_period": 100_000}}))
    assert outcome.failures == []
    assert [(a.control, a.value) for a in outcome.actions] == [
        ("vcpu_quota", -1),
        ("vcpu_period", 100_000),
    ]
    ctl.apply(context(sim, {"be": {"vcpu_shares": 512}}))
    assert sim.cpu_tune(uuid_of(sim, "be")).shares == 512
    with pytest.raises(HypervisorError):
        sim.set_cpu_tune(uuid_of(sim, "be"), quota=10, period=None, shares=None)


def test_balloon_changed_values_only_and_kept_within_min_and_max() -> None:
    sim = two_guests()
    calls: list[tuple[str, int]] = []
    real_set = sim.set_memory

    def spy(uuid: str, kib: int) -> None:
        calls.append((uuid, kib))
        real_set(uuid, kib)

    sim.set_memory = spy  # type: ignore[method-assign]
    ctl = BalloonController(sim)
    controls = {"be": {"balloon_target": 3 * GIB + 0.7}, "gold": {"balloon_target": 4 * GIB}}
    outcome = ctl.apply(context(sim, controls))
    # gold is already at 4 GiB: nothing to do.
    assert [(a.target, a.value) for a in outcome.actions] == [("be", 3 * GIB)]
    assert ctl.apply(context(sim, controls)).actions == []
    assert len(calls) == 1
    ctl.apply(context(sim, {"be": {"balloon_target": 1}, "gold": {"balloon_target": 99 * GIB}}))
    assert sim.balloon_info(uuid_of(sim, "be")).current == GIB
    assert sim.balloon_info(uuid_of(sim, "gold")).current == 4 * GIB


def test_balloon_target_in_whole_pages_rounded_up() -> None:
    """QEMU's balloon moves 4 KiB pages and leaves the guest a target rounded up to one
    (seen on real guests: 124518 KiB asked, 124520 reached): the controller asks for that,
    so the target it records is the one reached, and never below what the policy wanted."""
    sim = two_guests()
    ctl = BalloonController(sim)
    outcome = ctl.apply(context(sim, {"be": {"balloon_target": 3 * GIB - 4097.5}}))
    assert [a.value for a in outcome.actions] == [3 * GIB - 4096]
    assert sim.balloon_info(uuid_of(sim, "be")).current == 3 * GIB - 4096
    # Already a whole number of pages: as asked.
    outcome = ctl.apply(context(sim, {"be": {"balloon_target": 3 * GIB - 8192}}))
    assert [a.value for a in outcome.actions] == [3 * GIB - 8192]


def test_a_control_counts_as_applied_only_after_the_call_succeeded() -> None:
    sim = two_guests()
    ctl = BalloonController(sim)
    controls = {"be": {"balloon_target": 3 * GIB}}
    sim.broken.add("set_memory")
    outcome = ctl.apply(context(sim, controls))
    assert outcome.actions == [] and len(outcome.failures) == 1
    sim.broken.clear()
    assert [a.value for a in ctl.apply(context(sim, controls)).actions] == [3 * GIB]


def test_io_tune_per_disk_changed_only() -> None:
    sim = two_guests()
    ctl = IoTuneController(sim)
    request = [
        {"name": "vda", "path": None, "ioTune": {"total_iops_sec": 500, "read_bytes_sec": None}}
    ]
    assert len(ctl.apply(context(sim, {"be": {"io_tune": request}})).actions) == 1
    assert sim.io_tune(uuid_of(sim, "be"), "vda")["total_iops_sec"] == 500
    assert ctl.apply(context(sim, {"be": {"io_tune": request}})).actions == []


def test_stop_shuts_down_then_destroys_and_only_best_effort() -> None:
    sim = two_guests()
    ctl = StopController(sim)
    controls = {"be": {"stop": 1}, "gold": {"stop": 1}}
    first = ctl.apply(context(sim, controls))
    assert [(a.target, a.value) for a in first.actions] == [("be", "shutdown")]
    assert [f.target for f in first.failures] == ["gold"]
    # Still running at the next cycle (shutdown takes a step): destroyed.
    second = ctl.apply(context(sim, controls))
    assert [(a.target, a.value) for a in second.actions] == [("be", "destroy")]
    assert [g.name for g in sim.list_guests()] == ["gold"]


def test_migration_asked_once_per_episode_and_retried_on_failure() -> None:
    sim = two_guests()
    sent: list[tuple[str, str]] = []
    failing = [True]

    def send(uuid: str, reason: str) -> None:
        if failing[0]:
            raise ConnectionError("API down")
        sent.append((uuid, reason))

    ctl = MigrationController(send)
    host = {"mem_available": 1000, "mem_free": 100}
    asking = {"be": {"migrate": 1}}
    assert len(ctl.apply(context(sim, asking, host_stats=host)).failures) == 1
    failing[0] = False
    ctl.apply(context(sim, asking, host_stats=host))
    ctl.apply(context(sim, asking, host_stats=host))
    assert len(sent) == 1
    assert sent[0][0] == uuid_of(sim, "be")
    assert "vapor VM (priority 0)" in sent[0][1] and "10.0% memory free" in sent[0][1]
    ctl.apply(context(sim, {}))
    ctl.apply(context(sim, asking, host_stats=host))
    assert len(sent) == 2


def test_a_vm_stopped_is_not_also_asked_to_move() -> None:
    """Both asked of each guest: the vapor VM is stopped and not sent away (a move of a
    VM shutting down would be left in flight); the gold VM is never stopped, so it moves."""
    sim = two_guests()
    sent: list[str] = []
    both = {"be": {"stop": 1, "migrate": 1}, "gold": {"stop": 1, "migrate": 1}}
    ctx = context(sim, both)
    stopped = StopController(sim).apply(ctx)
    MigrationController(lambda uuid, reason: sent.append(uuid)).apply(ctx)
    assert [a.target for a in stopped.actions] == ["be"]
    assert sent == [uuid_of(sim, "gold")]
    assert stop_or_migrate(both["be"], ctx.guests["be"].tags) == (
        "stop: a vapor VM is powered off, and not also asked to move"
    )
    assert stop_or_migrate(both["gold"], ctx.guests["gold"].tags) == (
        "migrate: a gold VM is never stopped, so the agent refuses stop and asks to move it"
    )
    assert stop_or_migrate({"migrate": 1}, ctx.guests["be"].tags) is None


def test_controllers_ignore_guests_that_are_gone() -> None:
    sim = two_guests()
    ctx = context(sim, {"be": {"balloon_target": GIB}})
    info = {"gold": ctx.guests["gold"]}
    gone = ControlContext(ctx.result, ctx.host, info, ctx.snapshots)
    assert BalloonController(sim).apply(gone).actions == []
    assert isinstance(ctx.guests["be"], GuestInfo)
