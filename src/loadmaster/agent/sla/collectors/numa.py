"""NUMA: where a guest's memory is placed."""

from __future__ import annotations

from typing import Any

from loadmaster.agent.hypervisor.base import GuestInfo, Hypervisor
from loadmaster.agent.sla.collectors.base import CollectorSources, GuestCollector, Stats


class GuestNumaCollector:
    """The guest's memory placement as properties ``numa_mode`` ("strict", ...) and
    ``numa_nodeset`` ("" = any node): strings, which stats cannot be."""

    name = "guest-numa"
    fields: tuple[str, ...] = ()

    def __init__(self, hypervisor: Hypervisor) -> None:
        self.hypervisor = hypervisor

    def collect(self, guest: GuestInfo) -> tuple[Stats, dict[str, Any]]:
        tune = self.hypervisor.numa_tune(guest.uuid)
        return {}, {"numa_mode": tune.mode, "numa_nodeset": tune.nodeset}


def guest_numa(src: CollectorSources) -> GuestCollector:
    return GuestNumaCollector(src.hypervisor)
