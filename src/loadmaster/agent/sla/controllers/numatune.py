"""NUMA: where a guest's memory is placed."""

from __future__ import annotations

from typing import Any

from loadmaster.agent.hypervisor.base import NUMA_MODES, format_nodeset, parse_nodeset
from loadmaster.agent.sla.controllers.base import (
    ControlContext,
    Failure,
    HypervisorController,
    Outcome,
)


class NumaTuneController(HypervisorController):
    """``numa_mode`` (one of ``NUMA_MODES``) and ``numa_nodeset`` (libvirt's syntax, e.g.
    "0-1"; a number is one node): where the guest's memory is placed, set in one call
    when either changed. A value libvirt would refuse is reported and not sent. libvirt
    (QEMU) changes a running guest's node set only in strict mode and never its mode:
    those refusals come back as failures, retried while the policy asks."""

    name = "numatune"

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for guest, controls, snapshot in ctx.guest_controls():
            mode, nodeset = controls.get("numa_mode"), controls.get("numa_nodeset")
            if mode is None and nodeset is None:
                continue
            try:
                wanted = self._wanted(mode, nodeset)
            except ValueError as exc:
                out.failures.append(Failure(self.name, guest.name, f"refused: {exc}"))
                continue
            self._send_changed(
                out,
                guest,
                wanted,
                snapshot.properties,
                self.hypervisor.set_numa_tune,
                {"numa_mode": "mode", "numa_nodeset": "nodeset"},
            )
        return out

    @staticmethod
    def _wanted(mode: Any, nodeset: Any) -> dict[str, str]:
        wanted: dict[str, str] = {}
        if mode is not None:
            if mode not in NUMA_MODES:
                raise ValueError(f"numa_mode {mode!r} is not one of {', '.join(NUMA_MODES)}")
            wanted["numa_mode"] = mode
        if nodeset is not None:
            # The policy language has no integers-as-strings: node 0 arrives as 0 or 0.0.
            text = str(int(nodeset)) if isinstance(nodeset, int | float) else str(nodeset)
            wanted["numa_nodeset"] = format_nodeset(parse_nodeset(text))
        return wanted
