"""The simulated host's collectors: its memory and CPU as the simulator computes them,
and its KSM as on any host."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loadmaster.agent.hypervisor.simulated import SimulatedHypervisor
from loadmaster.agent.sla.collectors.base import HostCollector, Stats
from loadmaster.agent.sla.collectors.ksm import HostKsmCollector
from loadmaster.policy.snapshot import StatValue


class SimulatedHostCollector:
    """The simulated host's memory and CPU, in the fields the /proc collectors give."""

    name = "simulated-host"
    fields: tuple[str, ...] = (
        "mem_available",
        "mem_unused",
        "mem_free",
        "swap_total",
        "swap_usage",
        "cpu_count",
        "cpu_load",
    )

    def __init__(self, sim: SimulatedHypervisor) -> None:
        self.sim = sim

    def collect(self, guests: Sequence[Mapping[str, StatValue]]) -> Stats:
        return self.sim.host_stats()


def simulated_host_collectors(sim: SimulatedHypervisor) -> list[HostCollector]:
    """The host collectors of an agent on the simulator (its /proc is not the host's)."""
    return [SimulatedHostCollector(sim), HostKsmCollector(sim)]
