"""Controllers: turn the controls a policy cycle recorded into hypervisor calls, one
control a module (``balloon``, ``ksm``, ``cputune``, ``iotune``, ``nettune``,
``numatune``, ``stop``, ``migrate``), as MOM's; each is registered by entry point
(``loadmaster.agent.sla.plugins``).

Each controller remembers the value it last applied per target and only calls the
hypervisor when the policy asks for something different (before the first call, the
sampled value stands in). A value is remembered, and handed to the context's
``on_applied`` (the agent's journal), only once the call succeeded, so a failed or
interrupted call is simply retried next cycle. One target failing does not
stop the others; the agent isolates whole controllers from each other the same way.
"""

from loadmaster.agent.sla.controllers.base import (
    Action,
    ControlContext,
    Controller,
    ControllerSources,
    Failure,
    HypervisorController,
    MigrationSender,
    Outcome,
    default_controllers,
)
from loadmaster.agent.sla.controllers.stop import stop_or_migrate

__all__ = [
    "Action",
    "ControlContext",
    "Controller",
    "ControllerSources",
    "Failure",
    "HypervisorController",
    "MigrationSender",
    "Outcome",
    "default_controllers",
    "stop_or_migrate",
]
