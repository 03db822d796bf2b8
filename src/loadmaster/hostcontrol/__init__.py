"""The control plane's side of host agents: registration with discovered inventories, the
work list each agent carries out, launch and migration failures (with re-placement), and
which agents have gone silent.

Public API::

    HostControl(store, hosts, classes, ledger, scheduler, max_launch_attempts=3,
                silent_after_s=60)
        .register(name, hypervisor_uri=, inventories=, children=, shared_pool=) -> Registration
        .generation(host) -> int; .work(host) -> WorkList
        .report(host, running, launching=, seen_generation=, as_of=, usage=, load=)
        .launch_failed(vm, host, reason) -> LaunchFailure
        .migration_failed(vm, host, reason) -> LaunchFailure
        .status(host) -> AgentStatus
    HostWatch(store): one per server process; agents' long-polls wait on it, and what
        the process hears from agents is written through it in bulk.
"""

from loadmaster.hostcontrol.service import (
    ACTIONS,
    DEFAULT_MAX_LAUNCH_ATTEMPTS,
    DEFAULT_SILENT_AFTER_S,
    AgentStatus,
    HostControl,
    LaunchFailure,
    Registration,
)
from loadmaster.hostcontrol.watch import HostWatch, WatchedHost
from loadmaster.hostcontrol.worklists import WorkItem, WorkList

__all__ = [
    "ACTIONS",
    "DEFAULT_MAX_LAUNCH_ATTEMPTS",
    "DEFAULT_SILENT_AFTER_S",
    "AgentStatus",
    "HostControl",
    "HostWatch",
    "LaunchFailure",
    "Registration",
    "WatchedHost",
    "WorkItem",
    "WorkList",
]
