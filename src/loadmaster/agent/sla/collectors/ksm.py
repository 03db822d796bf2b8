"""KSM: the host's knobs and counters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loadmaster.agent.hypervisor.base import KSM_KEYS, Hypervisor
from loadmaster.agent.sla.collectors.base import CollectorSources, HostCollector, Stats
from loadmaster.policy.snapshot import StatValue


class HostKsmCollector:
    """KSM knobs and counters as ``ksm_*``; ``ksm_shareable`` is the guests' memory (KiB),
    standing in for MOM's sum of qemu process sizes."""

    name = "host-ksm"
    fields: tuple[str, ...] = (*(f"ksm_{k}" for k in KSM_KEYS), "ksm_shareable")

    def __init__(self, hypervisor: Hypervisor) -> None:
        self.hypervisor = hypervisor

    def collect(self, guests: Sequence[Mapping[str, StatValue]]) -> Stats:
        stats: Stats = {f"ksm_{k}": v for k, v in self.hypervisor.ksm_read().items()}
        sizes = [g.get("balloon_cur") for g in guests]
        stats["ksm_shareable"] = sum(s for s in sizes if s is not None)
        return stats


def host_ksm(src: CollectorSources) -> HostCollector:
    return HostKsmCollector(src.hypervisor)
