"""Migration: asking the scheduler to move a VM off this host."""

from __future__ import annotations

from loadmaster.agent.hypervisor.base import GuestInfo
from loadmaster.agent.sla.controllers.base import (
    Action,
    ControlContext,
    Controller,
    ControllerSources,
    Failure,
    MigrationSender,
    Outcome,
)
from loadmaster.agent.sla.controllers.stop import stop_wins
from loadmaster.tiers import priority_of, tier_of


class MigrationController(Controller):
    """``migrate`` = 1: ask the scheduler once to move the VM; asked again only after the
    policy stopped asking for a cycle."""

    name = "migrate"
    order = 90

    def __init__(self, send: MigrationSender) -> None:
        super().__init__()
        self.send = send

    @classmethod
    def build(cls, sources: ControllerSources) -> Controller | None:
        return None if sources.migration_sender is None else cls(sources.migration_sender)

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        asking = set()
        for guest, _snap, value in self._guest_controls(ctx, "migrate"):
            if int(value) != 1 or stop_wins(ctx.result.guest_controls[guest.name], guest.tags):
                continue
            asking.add(guest.uuid)
            if (guest.uuid, "migrate") in self._applied:
                continue
            reason = self._reason(ctx, guest)
            try:
                self.send(guest.uuid, reason)
            except Exception as exc:  # the sender is any client; its failure is retried
                out.failures.append(Failure(self.name, guest.name, f"{type(exc).__name__}: {exc}"))
                continue
            self._applied[(guest.uuid, "migrate")] = reason
            out.applied(Action(self.name, guest.name, "migrate", reason, guest.uuid))
        self.forget(asking)
        return out

    @staticmethod
    def _reason(ctx: ControlContext, guest: GuestInfo) -> str:
        tier, priority = tier_of(guest.tags).name, priority_of(guest.tags)
        total, free = ctx.host.stats.get("mem_available"), ctx.host.stats.get("mem_free")
        pressure = f", {100 * free / total:.1f}% memory free" if total and free is not None else ""
        return (
            f"SLA policy on host {ctx.host.name}: {tier} VM (priority {priority}) "
            f"moved off{pressure}"
        )
