"""Stopping VMs of a stoppable tier (vapor), and which wins when a policy asks a VM
both to stop and to migrate."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from loadmaster.agent.hypervisor.base import HypervisorError
from loadmaster.agent.sla.controllers.base import (
    Action,
    ControlContext,
    Failure,
    HypervisorController,
    Outcome,
)
from loadmaster.tiers import Tier, tier_of


class StopController(HypervisorController):
    """``stop`` = 1 on a VM of a stoppable tier (vapor): a clean shutdown first; if the VM
    is still running at a later cycle that asks again, it is destroyed. Other tiers are
    never stopped, whatever the policy asks."""

    name = "stop"
    order = 80

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for guest, _snap, value in self._guest_controls(ctx, "stop"):
            if int(value) != 1:
                continue
            tier = tier_of(guest.tags)
            if not tier.stoppable:
                out.failures.append(
                    Failure(self.name, guest.name, f"refused: {_never_stopped(tier)}")
                )
                continue
            force = self._applied.get((guest.uuid, "stop")) == "shutdown"
            try:
                self.hypervisor.stop_guest(guest.uuid, force=force)
            except HypervisorError as exc:
                out.failures.append(Failure(self.name, guest.name, str(exc)))
                continue
            how = "destroy" if force else "shutdown"
            self._applied[(guest.uuid, "stop")] = how
            out.applied(Action(self.name, guest.name, "stop", how, guest.uuid))
        return out


def _never_stopped(tier: Tier) -> str:
    return f"a {tier.name} VM is never stopped"


def asks(controls: Mapping[str, Any], control: str) -> bool:
    """Whether the policy requests ``control`` (``stop``, ``migrate``): the value 1,
    truncated as MOM's controllers do."""
    value = controls.get(control)
    return isinstance(value, int | float) and int(value) == 1


def stop_wins(controls: Mapping[str, Any], tags: Collection[str]) -> bool:
    """The policy asks to stop a VM of a stoppable tier: it is powered off and not also
    sent away, since a move of a VM shutting down would be left in flight, its source
    no longer running it. Any other tier is never stopped, so a move it is asked goes on."""
    return asks(controls, "stop") and tier_of(tags).stoppable


def stop_or_migrate(controls: Mapping[str, Any], tags: Collection[str]) -> str | None:
    """For a guest the policy asks both to stop and to migrate, which the agent carries
    out and why; None when it does not ask both."""
    if not (asks(controls, "stop") and asks(controls, "migrate")):
        return None
    tier = tier_of(tags)
    if stop_wins(controls, tags):
        return f"stop: a {tier.name} VM is powered off, and not also asked to move"
    return f"migrate: {_never_stopped(tier)}, so the agent refuses stop and asks to move it"
