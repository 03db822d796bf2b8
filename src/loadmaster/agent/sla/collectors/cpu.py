"""CPU: the host's count and load (``/proc/stat``), a guest's CPU tune and usage."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadmaster.agent.hypervisor.base import GuestInfo, Hypervisor
from loadmaster.agent.sla.collectors.base import (
    CollectorSources,
    GuestCollector,
    HostCollector,
    Stats,
)
from loadmaster.agent.sla.collectors.proc import read_text
from loadmaster.policy.snapshot import StatValue


class HostCpuCollector:
    """CPU count and busy fraction (0..1) between samples, from ``/proc/stat``."""

    name = "host-cpu"
    fields: tuple[str, ...] = ("cpu_count", "cpu_load")

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc = Path(proc_root)
        # (busy, total) jiffies of the previous sample; before it, since boot.
        self._prev = (0, 0)

    def collect(self, guests: Sequence[Mapping[str, StatValue]]) -> Stats:
        text = read_text(self.proc / "stat")
        count = 0
        totals: list[int] | None = None
        for line in (text or "").splitlines():
            name, _, rest = line.partition(" ")
            if name == "cpu":
                try:
                    totals = [int(v) for v in rest.split()]
                except ValueError:
                    totals = None
            elif name.startswith("cpu") and name[3:].isdigit():
                count += 1
        load: float | None = None
        if totals is not None and len(totals) >= 4:
            # idle and iowait are the 4th and 5th columns; guest time is already in user.
            idle = sum(totals[3:5])
            total = sum(totals[:8])
            d_total = total - self._prev[1]
            d_busy = (total - idle) - self._prev[0]
            self._prev = (total - idle, total)
            load = min(1.0, max(0.0, d_busy / d_total)) if d_total > 0 else 0.0
        return {"cpu_count": count or None, "cpu_load": load}


class GuestCpuCollector:
    """CPU tune (MOM's GuestCpuTune fields, plus shares) and ``cpu_usage``, the busy
    fraction of the vCPUs since the previous sample (absent on a guest's first sample,
    which has no interval yet, rather than reported missing)."""

    name = "guest-cpu"
    fields: tuple[str, ...] = (
        "vcpu_count",
        "vcpu_quota",
        "vcpu_period",
        "vcpu_shares",
        "vcpu_user_limit",
    )

    def __init__(self, hypervisor: Hypervisor, clock: Callable[[], float] = time.monotonic) -> None:
        self.hypervisor = hypervisor
        self.clock = clock
        self._prev: dict[str, tuple[float, int]] = {}

    def collect(self, guest: GuestInfo) -> tuple[Stats, dict[str, Any]]:
        cpu = self.hypervisor.cpu_stats(guest.uuid)
        tune = self.hypervisor.cpu_tune(guest.uuid)
        stats: Stats = {
            "vcpu_count": cpu.vcpu_count,
            "vcpu_quota": tune.quota,
            "vcpu_period": tune.period,
            "vcpu_shares": tune.shares,
            "vcpu_user_limit": guest.vcpu_user_limit,
        }
        now = self.clock()
        previous = self._prev.get(guest.uuid)
        self._prev[guest.uuid] = (now, cpu.cpu_time_ns)
        # A hypervisor that could not count the vCPUs gives None: no usage then.
        if previous is not None and now > previous[0] and (cpu.vcpu_count or 0) > 0:
            busy = (cpu.cpu_time_ns - previous[1]) / 1e9
            stats["cpu_usage"] = max(0.0, busy / ((now - previous[0]) * cpu.vcpu_count))
        return stats, {}

    def forget(self, uuids: set[str]) -> None:
        for uuid in [u for u in self._prev if u not in uuids]:
            del self._prev[uuid]


def host_cpu(src: CollectorSources) -> HostCollector:
    return HostCpuCollector(src.proc_root)


def guest_cpu(src: CollectorSources) -> GuestCollector:
    return GuestCpuCollector(src.hypervisor, src.clock)
