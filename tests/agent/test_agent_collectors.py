"""Collectors read fixture /proc and /sys folders; unreadable data is None, never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_helpers import FakePolicy

from loadmaster.agent.hypervisor.base import SysfsKsm
from loadmaster.agent.hypervisor.simulated import SimulatedHypervisor
from loadmaster.agent.sla import Agent
from loadmaster.agent.sla.collectors.cpu import HostCpuCollector
from loadmaster.agent.sla.collectors.ksm import HostKsmCollector
from loadmaster.agent.sla.collectors.memory import HostMemoryCollector
from loadmaster.agent.sla.simulated import simulated_agent


def test_host_memory_from_fixture(proc_dir: Path) -> None:
    stats = HostMemoryCollector(proc_dir).collect([])
    assert stats["mem_available"] == 32_768_000
    assert stats["mem_unused"] == 4_096_000
    assert stats["mem_free"] == 4_096_000 + 512_000 + 2_048_000
    assert stats["anon_pages"] == 24_000_000
    assert stats["swap_usage"] == 8_388_608 - 8_000_000
    assert stats["mem_pressure_some"] == 1.5
    assert stats["mem_pressure_full"] == 0.25
    assert (stats["swap_in"], stats["swap_out"]) == (0, 0)


def test_host_swap_is_counted_between_samples(proc_dir: Path) -> None:
    collector = HostMemoryCollector(proc_dir)
    collector.collect([])
    (proc_dir / "vmstat").write_text("pswpin 1300\npswpout 3410\n")
    stats = collector.collect([])
    assert (stats["swap_in"], stats["swap_out"]) == (100, 10)


def test_missing_and_unreadable_files_are_none(proc_dir: Path) -> None:
    (proc_dir / "pressure" / "memory").unlink()
    (proc_dir / "meminfo").unlink()
    # A directory where a file should be: reading it fails even for root.
    (proc_dir / "meminfo").mkdir()
    (proc_dir / "vmstat").write_text("pswpin garbage\n")
    stats = HostMemoryCollector(proc_dir).collect([])
    assert set(stats) == set(HostMemoryCollector.fields)
    assert all(value is None for value in stats.values())


def test_host_cpu_load_between_samples(proc_dir: Path) -> None:
    collector = HostCpuCollector(proc_dir)
    first = collector.collect([])
    assert first == {"cpu_count": 4, "cpu_load": pytest.approx(1500 / 10_000)}
    # 1000 more jiffies, 900 of them busy.
    (proc_dir / "stat").write_text("cpu  1800 0 600 8050 550 0 0 0 0 0\ncpu0 1 1 1 1\n")
    second = collector.collect([])
    assert second == {"cpu_count": 1, "cpu_load": pytest.approx(900 / 1000)}


def test_host_cpu_without_proc_stat(tmp_path: Path) -> None:
    assert HostCpuCollector(tmp_path).collect([]) == {"cpu_count": None, "cpu_load": None}


def test_ksm_from_sysfs_fixture(sys_dir: Path) -> None:
    (sys_dir / "kernel/mm/ksm/pages_volatile").unlink()
    hv = SimulatedHypervisor([], host_memory_kib=1)
    hv.ksm_read = SysfsKsm(sys_dir).read  # type: ignore[method-assign]
    stats = HostKsmCollector(hv).collect([{"balloon_cur": 1000}, {"balloon_cur": None}])
    assert stats["ksm_run"] == 1
    assert stats["ksm_pages_shared"] == 1000
    assert stats["ksm_merge_across_nodes"] == 1
    assert stats["ksm_pages_volatile"] is None
    assert stats["ksm_shareable"] == 1000


def test_broken_collector_is_reported_and_the_cycle_goes_on(tmp_path: Path) -> None:
    sim = SimulatedHypervisor.mixed(3, seed=1)
    sim.broken.add("memory_stats")
    policy = FakePolicy()
    agent = Agent(
        sim,
        tmp_path,
        host_collectors=[HostMemoryCollector(tmp_path / "no-proc")],
        policy_loader=policy.loader,
    )
    report = agent.run_cycle()
    assert "host.mem_free" in report.missing_stats
    assert "vm-0000.mem_unused" in report.missing_stats
    assert "vm-0000.balloon_cur" not in report.missing_stats
    assert {f.controller for f in report.failures} == {"guest-memory"}
    assert policy.seen[0][1][0].stats["balloon_cur"] is not None


def test_history_is_bounded(tmp_path: Path) -> None:
    sim = SimulatedHypervisor.mixed(2, seed=1)
    policy = FakePolicy()
    agent = simulated_agent(
        sim,
        tmp_path,
        policy_loader=policy.loader,
        history_length=4,
    )
    for _ in range(6):
        sim.advance()
        agent.run_cycle()
    host, guests = policy.seen[-1]
    assert len(host.history) == 4
    assert host.history[-1] is host.stats
    assert [len(g.history) for g in guests] == [4, 4]
    assert guests[0].stats["cpu_usage"] is not None
