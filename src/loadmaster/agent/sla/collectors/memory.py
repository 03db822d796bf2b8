"""Memory: the host's (``/proc/meminfo``, swap and pressure) and what a guest's balloon
driver reports, with the balloon's own sizes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loadmaster.agent.hypervisor.base import GuestInfo, Hypervisor
from loadmaster.agent.sla.collectors.base import (
    CollectorSources,
    GuestCollector,
    HostCollector,
    Stats,
)
from loadmaster.agent.sla.collectors.proc import parse_key_values, read_text
from loadmaster.policy.entities import HOST_MEMORY_STATS
from loadmaster.policy.snapshot import StatValue


def _difference(*parts: int | None) -> int | None:
    first, *rest = parts
    if first is None or any(p is None for p in rest):
        return None
    return first - sum(p for p in rest if p is not None)


class HostMemoryCollector:
    """MOM's HostMemory fields, plus the kernel's memory pressure (PSI ``avg10``, %)."""

    name = "host-memory"
    fields: tuple[str, ...] = (*HOST_MEMORY_STATS, "mem_pressure_some", "mem_pressure_full")

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc = Path(proc_root)
        self._swap_prev: tuple[int, int] | None = None

    def collect(self, guests: Sequence[Mapping[str, StatValue]]) -> Stats:
        meminfo = parse_key_values(read_text(self.proc / "meminfo"))
        free = meminfo.get("MemFree")
        buffers, cached = meminfo.get("Buffers"), meminfo.get("Cached")
        stats: Stats = {
            "mem_available": meminfo.get("MemTotal"),
            "mem_unused": free,
            "mem_free": None
            if free is None or buffers is None or cached is None
            else free + buffers + cached,
            "anon_pages": meminfo.get("AnonPages"),
            "swap_total": meminfo.get("SwapTotal"),
            "swap_usage": _difference(meminfo.get("SwapTotal"), meminfo.get("SwapFree")),
        }
        stats.update(self._swap_deltas())
        stats.update(self._pressure())
        return stats

    def _swap_deltas(self) -> Stats:
        vmstat = parse_key_values(read_text(self.proc / "vmstat"))
        swap_in, swap_out = vmstat.get("pswpin"), vmstat.get("pswpout")
        if swap_in is None or swap_out is None:
            return {"swap_in": None, "swap_out": None}
        previous = self._swap_prev or (swap_in, swap_out)
        self._swap_prev = (swap_in, swap_out)
        # Pages swapped since the previous sample; the first sample has no interval yet.
        return {"swap_in": swap_in - previous[0], "swap_out": swap_out - previous[1]}

    def _pressure(self) -> Stats:
        stats: Stats = {"mem_pressure_some": None, "mem_pressure_full": None}
        for line in (read_text(self.proc / "pressure" / "memory") or "").splitlines():
            kind, _, rest = line.partition(" ")
            fields = dict(p.split("=", 1) for p in rest.split() if "=" in p)
            if kind in ("some", "full") and "avg10" in fields:
                try:
                    stats[f"mem_pressure_{kind}"] = float(fields["avg10"])
                except ValueError:
                    continue
        return stats


class GuestMemoryCollector:
    """What the balloon driver reports from inside the guest (KiB, faults and swap pages)."""

    name = "guest-memory"
    fields: tuple[str, ...] = (
        "mem_available",
        "mem_unused",
        "mem_free",
        "swap_in",
        "swap_out",
        "major_fault",
        "minor_fault",
        "rss",
    )
    _SOURCES = {
        "mem_available": "available",
        "mem_unused": "unused",
        "mem_free": "usable",
        "swap_in": "swap_in",
        "swap_out": "swap_out",
        "major_fault": "major_fault",
        "minor_fault": "minor_fault",
        "rss": "rss",
    }

    def __init__(self, hypervisor: Hypervisor) -> None:
        self.hypervisor = hypervisor

    def collect(self, guest: GuestInfo) -> tuple[Stats, dict[str, Any]]:
        raw = self.hypervisor.memory_stats(guest.uuid)
        return {field: raw.get(src) for field, src in self._SOURCES.items()}, {}


class GuestBalloonCollector:
    name = "guest-balloon"
    fields: tuple[str, ...] = ("balloon_cur", "balloon_max", "balloon_min")

    def __init__(self, hypervisor: Hypervisor) -> None:
        self.hypervisor = hypervisor

    def collect(self, guest: GuestInfo) -> tuple[Stats, dict[str, Any]]:
        info = self.hypervisor.balloon_info(guest.uuid)
        stats: Stats = {
            "balloon_cur": info.current,
            "balloon_max": info.maximum,
            "balloon_min": info.minimum,
        }
        return stats, {}


def host_memory(src: CollectorSources) -> HostCollector:
    return HostMemoryCollector(src.proc_root)


def guest_memory(src: CollectorSources) -> GuestCollector:
    return GuestMemoryCollector(src.hypervisor)


def guest_balloon(src: CollectorSources) -> GuestCollector:
    return GuestBalloonCollector(src.hypervisor)
