"""MOM's collectors under MOM's names, declaring exactly MOM's mandatory and optional
fields (``HostMemory``, ``GuestCpuTune``, ...)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loadmaster.agent.hypervisor.base import KSM_KEYS, GuestInfo
from loadmaster.agent.sla.collectors.base import (
    CollectorSources,
    GuestCollector,
    HostCollector,
    Stats,
)
from loadmaster.agent.sla.collectors.cpu import guest_cpu, host_cpu
from loadmaster.agent.sla.collectors.io import guest_io
from loadmaster.agent.sla.collectors.ksm import host_ksm
from loadmaster.agent.sla.collectors.memory import guest_balloon, guest_memory, host_memory
from loadmaster.policy.entities import HOST_MEMORY_STATS
from loadmaster.policy.snapshot import StatValue


class _Declared:
    """A collector under one of MOM's names: it declares MOM's mandatory and optional
    fields and passes on only those, so a policy reads exactly what MOM would offer."""

    def __init__(
        self, name: str, inner: Any, mandatory: Sequence[str], optional: Sequence[str]
    ) -> None:
        self.name = name
        self.inner = inner
        self.mandatory_fields = tuple(mandatory)
        self.fields = (*mandatory, *(f for f in optional if f not in mandatory))

    def _only_declared(self, stats: Mapping[str, StatValue]) -> Stats:
        return {k: v for k, v in stats.items() if k in self.fields}

    def forget(self, uuids: set[str]) -> None:
        forget = getattr(self.inner, "forget", None)
        if forget is not None:
            forget(uuids)


class DeclaredHostCollector(_Declared):
    def collect(self, guests: Sequence[Mapping[str, StatValue]]) -> Stats:
        return self._only_declared(self.inner.collect(guests))


class DeclaredGuestCollector(_Declared):
    def collect(self, guest: GuestInfo) -> tuple[Stats, dict[str, Any]]:
        stats, properties = self.inner.collect(guest)
        return self._only_declared(stats), {k: v for k, v in properties.items() if k in self.fields}


_GUEST_MEMORY = ("mem_available", "mem_unused", "major_fault", "minor_fault", "swap_in", "swap_out")


_GUEST_SWAP = ("swap_total", "swap_usage")


_BALLOON = ("balloon_cur", "balloon_max", "balloon_min")


_CPU_TUNE = ("vcpu_quota", "vcpu_period", "vcpu_user_limit", "vcpu_count")


_HOST_KSM = (*(f"ksm_{k}" for k in KSM_KEYS), "ksm_shareable")


def _host(
    name: str,
    build: Callable[[CollectorSources], Any],
    mandatory: Sequence[str],
    optional: Sequence[str] = (),
) -> Callable[[CollectorSources], HostCollector]:
    return lambda src: DeclaredHostCollector(name, build(src), mandatory, optional)


def _guest(
    name: str,
    build: Callable[[CollectorSources], Any],
    mandatory: Sequence[str],
    optional: Sequence[str] = (),
) -> Callable[[CollectorSources], GuestCollector]:
    return lambda src: DeclaredGuestCollector(name, build(src), mandatory, optional)


# MOM's collectors by MOM's name, with MOM's declarations (mom/Collectors/*.py). ``ksmd_cpu_usage``
# is declared but not measured (nil): MOM reads it from ksmd's /proc entry, which a test
# host or the simulator does not have. ``io_tune`` is a property of the guest here.
# GuestQemuProc, GuestQemuAgent and GuestNetworkDaemon need a qemu pid or an agent inside
# the guest, which the hypervisor interface does not give; they are not offered.
mom_host_memory = _host("HostMemory", host_memory, HOST_MEMORY_STATS)


mom_host_ksm = _host("HostKSM", host_ksm, _HOST_KSM, ("ksmd_cpu_usage",))


mom_host_cpu = _host("HostCpu", host_cpu, ("cpu_count",))


mom_guest_memory = _guest("GuestMemory", guest_memory, _GUEST_MEMORY, _GUEST_SWAP)


mom_guest_memory_optional = _guest(
    "GuestMemoryOptional", guest_memory, (), (*_GUEST_MEMORY, *_GUEST_SWAP)
)


mom_guest_balloon = _guest("GuestBalloon", guest_balloon, _BALLOON)


mom_guest_balloon_optional = _guest("GuestBalloonOptional", guest_balloon, (), _BALLOON)


mom_guest_cpu_tune = _guest("GuestCpuTune", guest_cpu, _CPU_TUNE)


mom_guest_io_tune = _guest("GuestIoTune", guest_io, ("io_tune",))


mom_guest_io_tune_optional = _guest("GuestIoTuneOptional", guest_io, (), ("io_tune",))
