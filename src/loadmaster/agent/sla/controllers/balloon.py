"""The balloon: a guest's memory target."""

from __future__ import annotations

from functools import partial

from loadmaster.agent.sla.controllers.base import ControlContext, HypervisorController, Outcome

# The balloon moves whole pages: QEMU leaves a guest its target rounded up to 4 KiB.
BALLOON_PAGE_KIB = 4


class BalloonController(HypervisorController):
    """``balloon_target`` (KiB), in whole 4 KiB pages, kept within the guest's guaranteed
    minimum and its size."""

    name = "balloon"

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for guest, snap, value in self._guest_controls(ctx, "balloon_target"):
            # Asked as QEMU will set it, so the target is what the guest's stats then show
            # (and rounding up never cuts below a tier's floor).
            target = -(-int(value) // BALLOON_PAGE_KIB) * BALLOON_PAGE_KIB
            low, high = snap.stats.get("balloon_min"), snap.stats.get("balloon_max")
            if high is not None and high > 0:
                target = min(target, int(high))
            if low is not None:
                target = max(target, int(low))
            if target == self._last(guest.uuid, "balloon_target", snap.stats.get("balloon_cur")):
                continue
            self._carry_out(
                out,
                guest,
                partial(self.hypervisor.set_memory, guest.uuid, target),
                {"balloon_target": target},
            )
        return out
