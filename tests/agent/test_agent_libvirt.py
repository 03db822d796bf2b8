"""The libvirt hypervisor on libvirt's test driver, and a full agent cycle with the shipped
policies on it.

The test driver has no CPU tune: its scheduler is "fair" with only a ``weight``, so
``vcpu_quota``/``vcpu_period``/``cpu_shares`` are refused (the binding raises LookupError).
That is checked to surface as a reported failure here; the values themselves are tested
against the simulator's libvirt-equivalent checks. KSM is sysfs, tested on a fixture
folder. ``memoryStats`` returns fixed figures. IO tune works when the domain XML sets
``*_max`` limits (the test driver refuses a limit above its burst maximum).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from loadmaster.agent import run_agent
from loadmaster.agent.hypervisor.base import HypervisorError
from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor, parse_metadata
from loadmaster.agent.sla import Agent
from loadmaster.agent.sla.collectors.memory import GuestMemoryCollector
from loadmaster.agent.sla.controllers import ControlContext
from loadmaster.agent.sla.controllers.balloon import BalloonController
from loadmaster.policy import shipped_policy_dir
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot


def by_name(hv: LibvirtHypervisor) -> dict[str, Any]:
    return {g.name: g for g in hv.list_guests()}


def test_guests_carry_tags_limits_and_disks_from_metadata(node_hv: LibvirtHypervisor) -> None:
    guests = by_name(node_hv)
    assert set(guests) == {
        "web-platinum",
        "db-gold",
        "batch-silver",
        "scratch-be",
        "render-compute",
    }
    assert guests["render-compute"].tags == {"gold", "compute"}
    assert guests["batch-silver"].vcpu_user_limit == 50
    assert guests["web-platinum"].vcpu_user_limit == 100
    assert guests["db-gold"].disks == ("vda", "vdb")
    assert guests["db-gold"].io_limits["vdb"]["total_iops_sec"] == 2000
    info = node_hv.balloon_info(guests["db-gold"].uuid)
    assert (info.current, info.maximum, info.minimum) == (8_388_608, 8_388_608, 2_097_152)


def test_default_test_host_has_no_loadmaster_metadata() -> None:
    hv = LibvirtHypervisor("test:///default")
    try:
        [guest] = hv.list_guests()
        assert guest.name == "test" and guest.tags == frozenset() and guest.disks == ("vda",)
    finally:
        hv.close()


def test_bad_metadata_is_an_error() -> None:
    with pytest.raises(HypervisorError):
        parse_metadata("<vm><vcpu-limit>lots</vcpu-limit></vm>")
    with pytest.raises(HypervisorError):
        parse_metadata("<vm>")


def test_unreachable_hypervisor() -> None:
    with pytest.raises(HypervisorError, match="cannot connect"):
        LibvirtHypervisor("test:///no/such/node.xml")


def test_balloon_controller_sets_memory_read_back_by_info(node_hv: LibvirtHypervisor) -> None:
    guest = by_name(node_hv)["scratch-be"]
    snap = EntitySnapshot(
        guest.name, {"balloon_cur": 2_097_152, "balloon_max": 2_097_152, "balloon_min": 262_144}
    )
    result = CycleResult({}, {guest.name: {"balloon_target": 1_500_000.9}})
    ctx = ControlContext(
        result, EntitySnapshot("host", {}), {guest.name: guest}, {guest.name: snap}
    )
    outcome = BalloonController(node_hv).apply(ctx)
    assert outcome.failures == []
    assert node_hv.balloon_info(guest.uuid).current == 1_500_000
    assert node_hv.memory_stats(guest.uuid)["actual"] == 1_500_000


def test_memory_stats_collected(node_hv: LibvirtHypervisor) -> None:
    guest = by_name(node_hv)["web-platinum"]
    stats, _ = GuestMemoryCollector(node_hv).collect(guest)
    # The test driver makes its figures up, but they have the shape a guest reports.
    assert set(stats) == set(GuestMemoryCollector.fields)
    assert 0 < stats["mem_unused"] <= stats["mem_available"]  # type: ignore[operator]


def test_io_tune_set_and_read_back(node_hv: LibvirtHypervisor) -> None:
    guest = by_name(node_hv)["db-gold"]
    node_hv.set_io_tune(guest.uuid, "vdb", {"total_iops_sec": 2000, "total_bytes_sec": 52_428_800})
    tune = node_hv.io_tune(guest.uuid, "vdb")
    assert tune["total_iops_sec"] == 2000 and tune["total_bytes_sec"] == 52_428_800
    assert node_hv.block_stats(guest.uuid, "vdb").rd_bytes >= 0
    with pytest.raises(HypervisorError):
        node_hv.block_stats(guest.uuid, "sdz")


def test_cpu_tune_is_not_offered_by_the_test_driver(node_hv: LibvirtHypervisor) -> None:
    guest = by_name(node_hv)["batch-silver"]
    tune = node_hv.cpu_tune(guest.uuid)
    assert (tune.quota, tune.period, tune.shares) == (None, None, None)
    with pytest.raises(HypervisorError, match="not supported"):
        node_hv.set_cpu_tune(guest.uuid, quota=-1, period=100_000, shares=None)


def test_stop_guest(node_hv: LibvirtHypervisor) -> None:
    guests = by_name(node_hv)
    node_hv.stop_guest(guests["scratch-be"].uuid, force=False)
    node_hv.stop_guest(guests["batch-silver"].uuid, force=True)
    assert set(by_name(node_hv)) == {"web-platinum", "db-gold", "render-compute"}


def under_pressure(proc_dir: Path) -> None:
    """The host has 3 % of its memory free: critical pressure."""
    (proc_dir / "meminfo").write_text(
        "MemTotal: 32768000 kB\nMemFree: 600000 kB\nBuffers: 100000 kB\nCached: 300000 kB\n"
        "AnonPages: 30000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"
    )


def test_end_to_end_cycle_with_shipped_policies(
    node_hv: LibvirtHypervisor, proc_dir: Path, sys_dir: Path
) -> None:
    under_pressure(proc_dir)
    reports: list[tuple[str, dict[str, Any]]] = []
    migrations: list[str] = []
    agent = Agent(
        node_hv,
        shipped_policy_dir(),
        proc_root=proc_dir,
        host_name="node-1",
        reporter=lambda host, payload: reports.append((host, payload)),
        migration_sender=lambda uuid, reason: migrations.append(uuid),
    )
    guests = by_name(node_hv)
    report = agent.run_cycle()
    assert report.policy_error is None and report.guests == 5

    balloons = {a.target: a.value for a in report.actions if a.control == "balloon_target"}
    # Platinum keeps its memory; the others are ballooned down by at most 5 % a cycle.
    assert "web-platinum" not in balloons
    assert balloons["db-gold"] == node_hv.balloon_info(guests["db-gold"].uuid).current
    assert int(0.95 * 8_388_608) <= balloons["db-gold"] < 8_388_608
    # Critical pressure: the best-effort (vapor) VM is shut down, and not also asked to
    # move (the policy asks both); silver waits until no vapor VM is left.
    assert [a.target for a in report.actions if a.control == "stop"] == ["scratch-be"]
    assert migrations == []
    # IO limits from the metadata applied to every disk.
    assert node_hv.io_tune(guests["db-gold"].uuid, "vdb")["total_iops_sec"] == 2000
    # KSM started on the fixture sysfs (it was already at run=1: only the scan is tuned).
    assert (sys_dir / "kernel/mm/ksm/pages_to_scan").read_text() == "400\n"
    # The test driver has no CPU quota: reported, and nothing else stopped.
    assert {f.controller for f in report.failures} == {"cputune"}
    assert "host.ksm_shareable" not in report.missing_stats

    [(host, payload)] = reports
    assert host == "node-1"
    assert sorted(payload["running_vms"]) == sorted(g.uuid for g in guests.values())
    assert payload["usage"]["VCPU"] == 2 + 4 + 2 + 1 + 4
    assert payload["usage"]["MEMORY_MB"] == pytest.approx((32_768_000 - 1_000_000) / 1024, 0.01)
    assert payload["load"]["memory"] == pytest.approx(1 - 1_000_000 / 32_768_000, 1e-3)
    assert 0 <= payload["load"]["cpu"] <= 1

    second = agent.run_cycle()
    assert second.guests == 4  # the shut-down VM is gone
    assert not [a for a in second.actions if a.control == "io_tune:vda"]
    assert [a.target for a in second.actions if a.control == "migrate"] == ["batch-silver"]


def test_run_agent_on_the_default_test_host(tmp_path: Path) -> None:
    policy_dir = Path(shutil.copytree(shipped_policy_dir(), tmp_path / "policies"))
    reports = run_agent("test:///default", policy_dir, 0.0, None, None, "h1", cycles=2)
    assert [r.cycle for r in reports] == [1, 2]
    assert all(r.policy_error is None and r.guests == 1 for r in reports)
