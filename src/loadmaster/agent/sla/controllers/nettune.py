"""Network bandwidth: a guest's per-interface limits."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from loadmaster.agent.hypervisor.base import (
    NET_DIRECTIONS,
    NET_KEYS,
    NET_LIMIT_MAX,
    NET_PARAMS,
    GuestInfo,
)
from loadmaster.agent.sla.controllers.base import (
    ControlContext,
    Failure,
    HypervisorController,
    Outcome,
)

# The guest control for each libvirt interface parameter: "inbound.average" is set by
# ``net_inbound_average``. ``<control>@<interface>`` sets it for one interface only and
# wins over the plain control, which applies to every interface of the guest.
NET_CONTROLS: dict[str, str] = {key: f"net_{key.replace('.', '_')}" for key in NET_KEYS}


NET_INTERFACE_SEPARATOR = "@"


def net_limit(value: Any) -> int:
    """A policy limit as libvirt accepts it: non-positive is "no limit" (0), and the
    value is capped at libvirt's unsigned int."""
    return min(NET_LIMIT_MAX, max(0, int(value)))


class NetTuneController(HypervisorController):
    """Per interface, the ``net_<direction>_<average|peak|burst>`` controls (KiB/s, burst
    KiB; 0 = no limit). libvirt wants a direction's average whenever its peak or burst is
    set, so a change sends the whole direction: the new values and the last known rest."""

    name = "nettune"

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for guest, controls, snapshot in ctx.guest_controls():
            sampled = snapshot.properties.get("net_bandwidth") or {}
            for interface in guest.interfaces:
                self._apply_interface(guest, interface, controls, sampled.get(interface, {}), out)
        return out

    def _apply_interface(
        self,
        guest: GuestInfo,
        interface: str,
        controls: Mapping[str, Any],
        sampled: Mapping[str, int],
        out: Outcome,
    ) -> None:
        current = {
            key: self._last(guest.uuid, self._control(key, interface), sampled.get(key))
            for key in NET_KEYS
        }
        wanted: dict[str, int] = {}
        for key, control in NET_CONTROLS.items():
            value = controls.get(f"{control}{NET_INTERFACE_SEPARATOR}{interface}")
            if value is None:
                value = controls.get(control)
            if value is None:
                continue
            try:
                wanted[key] = net_limit(value)
            except (TypeError, ValueError):
                out.failures.append(
                    Failure(self.name, guest.name, f"refused: {control}={value!r} is no number")
                )
                return
        for direction in NET_DIRECTIONS:
            # As libvirt does: a direction without an average has no peak or burst either,
            # so what is remembered is what the interface really has.
            if wanted.get(f"{direction}.average") == 0:
                wanted.update({f"{direction}.{p}": 0 for p in NET_PARAMS})
        changed = {k for k, v in wanted.items() if v != current[k]}
        if not changed:
            return
        limits: dict[str, int] = {}
        for direction in NET_DIRECTIONS:
            keys = [f"{direction}.{p}" for p in NET_PARAMS]
            if changed.intersection(keys):
                limits.update({k: wanted.get(k, current[k] or 0) for k in keys})
        self._carry_out(
            out,
            guest,
            partial(self.hypervisor.set_interface_bandwidth, guest.uuid, interface, limits),
            {self._control(key, interface): value for key, value in limits.items()},
            reported={self._control(key, interface) for key in changed},
            failure_prefix=f"{interface}: ",
        )

    @staticmethod
    def _control(key: str, interface: str) -> str:
        """How an applied limit is remembered and journalled: per interface."""
        return f"{NET_CONTROLS[key]}{NET_INTERFACE_SEPARATOR}{interface}"
