"""The host agent: keeps one host inside its SLA promises, as MOM does for oVirt.

Every cycle collectors read the host and its guests into ``EntitySnapshot``s, the policy
(``loadmaster.policy``, hot-reloaded from a directory) decides controls, and controllers
apply them: balloon, KSM, CPU tune, IO tune, network bandwidth, NUMA placement, stopping
vapor VMs and asking the scheduler to migrate VMs. Usage is reported to the loadmaster API.

Public API::

    run_agent(hypervisor_uri, policy_dir, interval, api_url, token, host_name, cycles)
        -> list[CycleReport]
    simulate_host(guests, steps, seed, out_dir) -> SimulationResult
    Agent(hypervisor, policy_dir, interval, host_collectors=None, guest_collectors=None,
          controllers=None, reporter=None, *, host_name=..., migration_sender=...,
          collectors=None)   # collectors="vdsm" / "mom-libvirt": MOM's sets by name
        .run_cycle() -> CycleReport; .run_forever(stop_event)
    LibvirtHypervisor(uri, sys_root=None), SimulatedHypervisor(...).mixed(...)
    Collectors and controllers are plugins (``loadmaster.agent.plugins``): entry-point
    groups loadmaster.host_collectors, loadmaster.guest_collectors, loadmaster.controllers.
    AppliedJournal(state_dir) .cycle_start/.applied/.cycle_end; read_journal(state_dir)
        -> JournalState(last, interrupted, open_cycle, ...)
"""

from loadmaster.agent.hypervisor.base import GuestInfo, Hypervisor, HypervisorError
from loadmaster.agent.hypervisor.libvirt import METADATA_NS, LibvirtHypervisor
from loadmaster.agent.hypervisor.simulated import SimulatedHypervisor
from loadmaster.agent.runner import run_agent
from loadmaster.agent.sla.journal import (
    AppliedJournal,
    AppliedRecord,
    JournalError,
    JournalState,
    read_journal,
)
from loadmaster.agent.sla.loop import Agent, CycleReport
from loadmaster.demo.simulation import SimulationResult, simulate_host

__all__ = [
    "METADATA_NS",
    "Agent",
    "AppliedJournal",
    "AppliedRecord",
    "CycleReport",
    "GuestInfo",
    "Hypervisor",
    "HypervisorError",
    "JournalError",
    "JournalState",
    "LibvirtHypervisor",
    "SimulatedHypervisor",
    "SimulationResult",
    "read_journal",
    "run_agent",
    "simulate_host",
]
