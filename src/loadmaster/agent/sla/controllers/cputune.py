"""CPU tune: a guest's vCPU quota, period and shares."""

from __future__ import annotations

from functools import partial

from loadmaster.agent.hypervisor.base import (
    PERIOD_MAX,
    PERIOD_MIN,
    QUOTA_MAX,
    QUOTA_MIN,
    QUOTA_UNLIMITED,
    SHARES_MAX,
    SHARES_MIN,
)
from loadmaster.agent.sla.controllers.base import ControlContext, HypervisorController, Outcome


def libvirt_quota(value: float) -> int:
    """A policy quota as libvirt accepts it: any non-positive value (the policies' reset,
    -1) is "unlimited"; anything else is clamped to libvirt's range."""
    quota = int(value)
    if quota <= 0:
        return QUOTA_UNLIMITED
    return min(QUOTA_MAX, max(QUOTA_MIN, quota))


def libvirt_period(value: float) -> int:
    return min(PERIOD_MAX, max(PERIOD_MIN, int(value)))


def libvirt_shares(value: float) -> int:
    return min(SHARES_MAX, max(SHARES_MIN, int(value)))


class CpuTuneController(HypervisorController):
    """``vcpu_quota``, ``vcpu_period`` (µs) and ``vcpu_shares``, translated to values libvirt
    accepts, sent together in one call when any of them changed."""

    name = "cputune"
    _CONTROLS = (
        ("vcpu_quota", libvirt_quota),
        ("vcpu_period", libvirt_period),
        ("vcpu_shares", libvirt_shares),
    )

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for name, controls in ctx.result.guest_controls.items():
            guest = ctx.guests.get(name)
            if guest is None:
                continue
            wanted = {
                control: translate(controls[control])
                for control, translate in self._CONTROLS
                if controls.get(control) is not None
            }
            changed = self._changed(guest, wanted, ctx.snapshots[name].stats)
            if not changed:
                continue
            self._carry_out(
                out,
                guest,
                partial(
                    self.hypervisor.set_cpu_tune,
                    guest.uuid,
                    quota=changed.get("vcpu_quota"),
                    period=changed.get("vcpu_period"),
                    shares=changed.get("vcpu_shares"),
                ),
                changed,
            )
        return out
