"""Network: a guest's interfaces and their bandwidth limits."""

from __future__ import annotations

from typing import Any

from loadmaster.agent.hypervisor.base import NET_KEYS, GuestInfo, Hypervisor
from loadmaster.agent.sla.collectors.base import CollectorSources, GuestCollector, Stats


class GuestNetCollector:
    """``net_interfaces`` (how many), and the bandwidth limits every interface has now:
    property ``net_bandwidth`` = {interface: {"inbound.average": KiB/s, ...}} for the
    controller, and the first interface's limits as stats ``net_inbound_average`` ...
    ``net_outbound_burst`` for policies (absent, not missing, without an interface)."""

    name = "guest-net"
    fields: tuple[str, ...] = ("net_interfaces",)

    def __init__(self, hypervisor: Hypervisor) -> None:
        self.hypervisor = hypervisor

    def collect(self, guest: GuestInfo) -> tuple[Stats, dict[str, Any]]:
        bandwidth = {
            interface: dict(self.hypervisor.interface_bandwidth(guest.uuid, interface))
            for interface in guest.interfaces
        }
        stats: Stats = {"net_interfaces": len(guest.interfaces)}
        if guest.interfaces:
            first = bandwidth[guest.interfaces[0]]
            stats.update({f"net_{k.replace('.', '_')}": first.get(k) for k in NET_KEYS})
        return stats, {"net_bandwidth": bandwidth}


def guest_net(src: CollectorSources) -> GuestCollector:
    return GuestNetCollector(src.hypervisor)
