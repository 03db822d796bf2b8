"""CPU tune: a guest's vCPU quota, period and shares."""

from __future__ import annotations

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
    # control, its translation, and the keyword it is sent as
    _CONTROLS = (
        ("vcpu_quota", libvirt_quota, "quota"),
        ("vcpu_period", libvirt_period, "period"),
        ("vcpu_shares", libvirt_shares, "shares"),
    )

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        keywords = {control: keyword for control, _, keyword in self._CONTROLS}
        for guest, controls, snapshot in ctx.guest_controls():
            wanted = {
                control: translate(controls[control])
                for control, translate, _ in self._CONTROLS
                if controls.get(control) is not None
            }
            self._send_changed(
                out, guest, wanted, snapshot.stats, self.hypervisor.set_cpu_tune, keywords
            )
        return out
