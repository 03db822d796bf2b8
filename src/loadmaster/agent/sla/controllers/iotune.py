"""IO tune: a guest's per-disk limits (MOM's ``io_tune`` request)."""

from __future__ import annotations

from functools import partial

from loadmaster.agent.sla.controllers.base import ControlContext, HypervisorController, Outcome


class IoTuneController(HypervisorController):
    """MOM's ``io_tune`` request: per disk, the six limits to set (nil keeps a limit)."""

    name = "iotune"

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for guest, _snap, request in self._guest_controls(ctx, "io_tune"):
            for entry in request:
                disk = str(entry.get("name") or entry.get("path") or "")
                limits = {k: int(v) for k, v in entry.get("ioTune", {}).items() if v is not None}
                key = f"io_tune:{disk}"
                if not disk or not limits or limits == self._last(guest.uuid, key, None):
                    continue
                self._carry_out(
                    out,
                    guest,
                    partial(self.hypervisor.set_io_tune, guest.uuid, disk, limits),
                    {key: limits},
                )
        return out
