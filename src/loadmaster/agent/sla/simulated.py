"""An SLA agent on the simulator, as the demos, the benchmarks and the tests run it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadmaster.agent.hypervisor.simulated import SimulatedHypervisor
from loadmaster.agent.sla.collectors.sets import default_guest_collectors
from loadmaster.agent.sla.collectors.simulated import simulated_host_collectors
from loadmaster.agent.sla.loop import Agent


def simulated_agent(sim: SimulatedHypervisor, policy_dir: Path, **kwargs: Any) -> Agent:
    """An ``Agent`` on ``sim``: the host collectors read the simulated host (its /proc is
    not the host's), the default guest collectors run on the simulator's clock; the other
    arguments are ``Agent``'s."""
    return Agent(
        sim,
        policy_dir,
        host_collectors=simulated_host_collectors(sim),
        guest_collectors=default_guest_collectors(sim, sim.clock),
        **kwargs,
    )
