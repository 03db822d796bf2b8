"""Shared by the agent tests: fixture paths, a fake policy, an agent on the simulator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loadmaster.agent.hypervisor.simulated import SimulatedHypervisor
from loadmaster.agent.sla import Agent
from loadmaster.agent.sla.collectors import default_guest_collectors
from loadmaster.agent.sla.collectors.simulated import simulated_host_collectors
from loadmaster.policy import PolicyError
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NODE_XML = FIXTURES / "node.xml"


class FakePolicy:
    """Stands in for ``loadmaster.policy.Policy``: returns fixed controls, or raises."""

    def __init__(
        self,
        host_controls: Mapping[str, Any] | None = None,
        guest_controls: Mapping[str, Mapping[str, Any]] | None = None,
        error: PolicyError | None = None,
    ) -> None:
        self.host_controls = dict(host_controls or {})
        self.guest_controls = dict(guest_controls or {})
        self.error = error
        self.seen: list[tuple[EntitySnapshot, list[EntitySnapshot]]] = []

    def evaluate(self, host: EntitySnapshot, guests: Sequence[EntitySnapshot]) -> CycleResult:
        self.seen.append((host, list(guests)))
        if self.error is not None:
            raise self.error
        return CycleResult(self.host_controls, self.guest_controls)

    def loader(self, _directory: Path) -> FakePolicy:
        return self


def sim_agent(sim: SimulatedHypervisor, policy_dir: Path, **kwargs: Any) -> Agent:
    return Agent(
        sim,
        policy_dir,
        host_collectors=simulated_host_collectors(sim),
        guest_collectors=default_guest_collectors(sim, sim.clock),
        **kwargs,
    )
