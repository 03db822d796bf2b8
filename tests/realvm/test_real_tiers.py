"""The agent with the shipped policies on real QEMU guests: under host memory pressure,
platinum is never ballooned and gold never goes below 75 % of its memory, checked after
every cycle, while a silver guest shows that the pressure really reclaims memory.

The host's memory pressure comes from a /proc fixture (the machine's own is not under
pressure); everything about the guests is real: their balloon drivers, their memory
stats, QEMU's balloon. KSM goes to a fixture /sys, never the machine's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from realvm_helpers import (
    MIB,
    Launched,
    RealHosts,
    fixture_sys,
    new_spec,
    pressured_proc,
    serial,
    settled,
    wait_for,
)

from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor
from loadmaster.agent.sla import Agent
from loadmaster.policy import shipped_policy_dir

pytestmark = [pytest.mark.realvm, pytest.mark.xdist_group("realvm")]

GUEST_MIB = 128
CYCLES = 8


@pytest.fixture
def agent_hv(real_hosts: RealHosts, tmp_path: Path) -> Iterator[LibvirtHypervisor]:
    hv = real_hosts.hypervisor(real_hosts.a, sys_root=fixture_sys(tmp_path / "sys"))
    yield hv
    hv.close()


def test_platinum_never_ballooned_gold_not_below_75_percent(
    agent_hv: LibvirtHypervisor, launched: Launched, real_hosts: RealHosts, tmp_path: Path
) -> None:
    proc = pressured_proc(tmp_path / "proc")
    guests = {tier: new_spec(GUEST_MIB, tier) for tier in ("platinum", "gold", "silver")}
    for spec in guests.values():
        agent_hv.launch_guest(spec)
        launched.uuids.append(spec.uuid)
    for spec in guests.values():
        launched_at = time.monotonic()
        wait_for(f"{spec.name} booting", lambda s=spec: "lm-guest: up" in serial(real_hosts, s), 60)
        # The policy skips a guest until its balloon driver has reported memory stats.
        wait_for(
            f"{spec.name} memory stats",
            lambda s=spec: "unused" in agent_hv.memory_stats(s.uuid),
            30 - (time.monotonic() - launched_at),
        )

    agent = Agent(agent_hv, shipped_policy_dir(), 0.0, proc_root=proc, host_name="real-a")
    full = GUEST_MIB * MIB
    seen: dict[str, list[int]] = {tier: [] for tier in guests}
    for cycle in range(1, CYCLES + 1):
        report = agent.run_cycle()
        assert report.policy_error is None, report.policy_error
        assert not [f for f in report.failures if f.controller == "balloon"], report.failures
        for tier, spec in guests.items():
            wait_for(f"{tier} balloon settling", lambda s=spec: settled(agent_hv, s.uuid), 10)
            actual = int(agent_hv.memory_stats(spec.uuid)["actual"])
            seen[tier].append(actual)
        assert seen["platinum"][-1] == full, f"cycle {cycle}: platinum ballooned {seen}"
        assert seen["gold"][-1] >= 0.75 * full, f"cycle {cycle}: gold below 75 % {seen}"
    print({tier: [round(a / full, 3) for a in values] for tier, values in seen.items()})

    # The pressure was real: silver went below gold's floor, and gold was held at it.
    assert seen["silver"][-1] < 0.75 * full, seen
    assert seen["gold"][-1] <= 0.8 * full, seen
