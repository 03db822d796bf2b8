"""Collectors: read the host and its guests into the stats a policy sees.

A collector declares the ``fields`` it provides and, as MOM's do, which of them are
mandatory (``mandatory_fields``, a subset; absent = none). A field it cannot read comes
back ``None``; a collector that raises is reported by the agent with all its fields
``None``. A sample lacking a mandatory field makes its entity not ready for the cycle
(see ``loop.Agent``). Host collectors also see this cycle's guest stats, for host
figures that summarise guests (``ksm_shareable``).

The agent's configuration picks collectors by MOM's names (``HostMemory``,
``GuestCpuTune``, ...; ``MOM_COLLECTORS``) or a whole set by name (``COLLECTOR_SETS``:
``vdsm``, ``mom-libvirt``, ``loadmaster``, the default). A MOM-named collector declares
exactly MOM's mandatory and optional fields, so the fields a policy can read are MOM's.

This module holds the collectors, one class per source, as MOM's.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, cast

from loadmaster.agent.hypervisor.base import KSM_KEYS, NET_KEYS, GuestInfo, Hypervisor
from loadmaster.agent.plugins import GUEST_COLLECTOR_GROUP, HOST_COLLECTOR_GROUP, registered
from loadmaster.policy.entities import HOST_MEMORY_STATS, HOST_TIME_STATS
from loadmaster.policy.snapshot import StatValue

log = logging.getLogger(__name__)

Stats = dict[str, StatValue]
DEFAULT_HISTORY = 10


class HostCollector(Protocol):
    name: str
    fields: tuple[str, ...]

    def collect(self, guests: Sequence[Mapping[str, StatValue]]) -> Stats: ...


class GuestCollector(Protocol):
    name: str
    fields: tuple[str, ...]

    def collect(self, guest: GuestInfo) -> tuple[Stats, dict[str, Any]]:
        """Stats and properties (``io_tune``) of one guest."""
        ...


class History:
    """The last samples of every entity, oldest first, for ``StatAvg``."""

    def __init__(self, length: int = DEFAULT_HISTORY) -> None:
        self.length = length
        self._samples: dict[str, deque[Mapping[str, StatValue]]] = {}

    def add(
        self, entity: str, stats: Mapping[str, StatValue]
    ) -> tuple[Mapping[str, StatValue], ...]:
        samples = self._samples.get(entity)
        if samples is None:
            samples = self._samples[entity] = deque(maxlen=self.length)
        samples.append(stats)
        return tuple(samples)

    def samples(self, entity: str) -> tuple[Mapping[str, StatValue], ...]:
        return tuple(self._samples.get(entity, ()))

    def keep_only(self, entities: set[str]) -> None:
        for name in [n for n in self._samples if n not in entities]:
            del self._samples[name]


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc)
        return None


def parse_key_values(text: str | None) -> dict[str, int]:
    """``/proc/meminfo`` (``MemTotal:  16 kB``) and ``/proc/vmstat`` (``pswpin 3``) lines."""
    values: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2:
            try:
                values[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return values


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
        meminfo = parse_key_values(_read_text(self.proc / "meminfo"))
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
        vmstat = parse_key_values(_read_text(self.proc / "vmstat"))
        swap_in, swap_out = vmstat.get("pswpin"), vmstat.get("pswpout")
        if swap_in is None or swap_out is None:
            return {"swap_in": None, "swap_out": None}
        previous = self._swap_prev or (swap_in, swap_out)
        self._swap_prev = (swap_in, swap_out)
        # Pages swapped since the previous sample; the first sample has no interval yet.
        return {"swap_in": swap_in - previous[0], "swap_out": swap_out - previous[1]}

    def _pressure(self) -> Stats:
        stats: Stats = {"mem_pressure_some": None, "mem_pressure_full": None}
        for line in (_read_text(self.proc / "pressure" / "memory") or "").splitlines():
            kind, _, rest = line.partition(" ")
            fields = dict(p.split("=", 1) for p in rest.split() if "=" in p)
            if kind in ("some", "full") and "avg10" in fields:
                try:
                    stats[f"mem_pressure_{kind}"] = float(fields["avg10"])
                except ValueError:
                    continue
        return stats


class HostCpuCollector:
    """CPU count and busy fraction (0..1) between samples, from ``/proc/stat``."""

    name = "host-cpu"
    fields: tuple[str, ...] = ("cpu_count", "cpu_load")

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc = Path(proc_root)
        # (busy, total) jiffies of the previous sample; before it, since boot.
        self._prev = (0, 0)

    def collect(self, guests: Sequence[Mapping[str, StatValue]]) -> Stats:
        text = _read_text(self.proc / "stat")
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


class GuestIoCollector:
    """Bytes read and written over all disks, and MOM's ``io_tune`` property for the disks
    that have an IO policy (maximum limits from the guest's metadata)."""

    name = "guest-io"
    fields: tuple[str, ...] = ("io_read_bytes", "io_write_bytes")

    def __init__(self, hypervisor: Hypervisor) -> None:
        self.hypervisor = hypervisor

    def collect(self, guest: GuestInfo) -> tuple[Stats, dict[str, Any]]:
        read = written = 0
        for disk in guest.disks:
            block = self.hypervisor.block_stats(guest.uuid, disk)
            read += block.rd_bytes
            written += block.wr_bytes
        properties: dict[str, Any] = {}
        if guest.io_limits:
            properties["io_tune"] = [
                {
                    "name": disk,
                    "path": None,
                    "maximum": dict(maximum),
                    "current": dict(self.hypervisor.io_tune(guest.uuid, disk)),
                }
                for disk, maximum in guest.io_limits.items()
            ]
        return {"io_read_bytes": read, "io_write_bytes": written}, properties


# -- network bandwidth and NUMA memory tuning ---------------------------------------------


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


class HostTimeCollector:
    """MOM's HostTime: the local date and time, for policies that act by time of day."""

    name = "host-time"
    fields: tuple[str, ...] = HOST_TIME_STATS
    mandatory_fields = fields

    def __init__(self, now: Callable[[], datetime] = datetime.now) -> None:
        self.now = now

    def collect(self, guests: Sequence[Mapping[str, StatValue]]) -> Stats:
        t = self.now()
        values = (t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond)
        return dict(zip(self.fields, values, strict=True))


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


@dataclass(frozen=True)
class CollectorSources:
    """What collectors are built from."""

    hypervisor: Hypervisor
    proc_root: Path = Path("/proc")
    clock: Callable[[], float] = time.monotonic


# Fields a guest collector returns among its properties rather than its stats.
PROPERTY_FIELDS = ("io_tune",)
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


# The factories the entry points name (see ``loadmaster.agent.plugins`` and pyproject.toml).
# loadmaster's own collectors, under their own names:
def host_memory(src: CollectorSources) -> HostCollector:
    return HostMemoryCollector(src.proc_root)


def host_cpu(src: CollectorSources) -> HostCollector:
    return HostCpuCollector(src.proc_root)


def host_ksm(src: CollectorSources) -> HostCollector:
    return HostKsmCollector(src.hypervisor)


def host_time(src: CollectorSources) -> HostCollector:
    return HostTimeCollector()


def guest_memory(src: CollectorSources) -> GuestCollector:
    return GuestMemoryCollector(src.hypervisor)


def guest_balloon(src: CollectorSources) -> GuestCollector:
    return GuestBalloonCollector(src.hypervisor)


def guest_cpu(src: CollectorSources) -> GuestCollector:
    return GuestCpuCollector(src.hypervisor, src.clock)


def guest_io(src: CollectorSources) -> GuestCollector:
    return GuestIoCollector(src.hypervisor)


def guest_net(src: CollectorSources) -> GuestCollector:
    return GuestNetCollector(src.hypervisor)


def guest_numa(src: CollectorSources) -> GuestCollector:
    return GuestNumaCollector(src.hypervisor)


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


@dataclass(frozen=True)
class CollectorSet:
    """Host and guest collector names, in priority order (the first non-nil value wins)."""

    host: tuple[str, ...]
    guest: tuple[str, ...]


DEFAULT_COLLECTOR_SET = "loadmaster"
COLLECTOR_SETS: dict[str, CollectorSet] = {
    DEFAULT_COLLECTOR_SET: CollectorSet(
        ("host-memory", "host-cpu", "host-ksm"),
        ("guest-balloon", "guest-memory", "guest-cpu", "guest-io", "guest-net", "guest-numa"),
    ),
    # vdsm's mom.conf: [host] collectors, [guest] collectors.
    "vdsm": CollectorSet(
        ("HostMemory", "HostKSM", "HostCpu"),
        ("GuestMemoryOptional", "GuestBalloonOptional", "GuestCpuTune", "GuestIoTuneOptional"),
    ),
    # MOM's built-in defaults for the libvirt interface, without GuestQemuProc (see above).
    "mom-libvirt": CollectorSet(("HostMemory",), ("GuestMemory",)),
}


def collector_selection(text: str) -> CollectorSet:
    """A set's name (``vdsm``), or registered collector names separated by commas, each
    put on the host's or the guests' side by the group it is registered in. Raises
    ``ValueError`` naming what is unknown."""
    if text in COLLECTOR_SETS:
        return COLLECTOR_SETS[text]
    hosts, guests = registered(HOST_COLLECTOR_GROUP), registered(GUEST_COLLECTOR_GROUP)
    names = [n.strip() for n in text.split(",")]
    for name in names:
        if name not in hosts and name not in guests:
            raise ValueError(
                f"unknown collector set or collector {name!r} (sets: "
                f"{', '.join(sorted(COLLECTOR_SETS))}; collectors: "
                f"{', '.join(sorted({*hosts, *guests}))})"
            )
    return CollectorSet(
        tuple(n for n in names if n in hosts), tuple(n for n in names if n in guests)
    )


def named_collectors(
    selection: str | CollectorSet, sources: CollectorSources
) -> tuple[list[HostCollector], list[GuestCollector]]:
    """The collectors a configuration names: a set (``vdsm``), a comma list of collector
    names, or a ``CollectorSet``. Raises ``ValueError`` naming an unknown set or collector."""
    if isinstance(selection, str):
        selection = collector_selection(selection)
    built: list[list[Any]] = []
    for names, group, side in (
        (selection.host, HOST_COLLECTOR_GROUP, "host"),
        (selection.guest, GUEST_COLLECTOR_GROUP, "guest"),
    ):
        entries = registered(group)
        unknown = [n for n in names if n not in entries]
        if unknown:
            raise ValueError(
                f"unknown {side} collector {unknown[0]!r} (known: {', '.join(sorted(entries))})"
            )
        built.append([entries[n].load()(sources) for n in names])
    return built[0], built[1]


@dataclass(frozen=True)
class Declaration:
    """What a list of collectors declares for one kind of entity, as a MOM monitor sees it."""

    fields: frozenset[str]
    mandatory: frozenset[str]

    @classmethod
    def of(cls, collectors: Sequence[HostCollector] | Sequence[GuestCollector]) -> Declaration:
        mandatory: set[str] = set()
        fields: set[str] = set()
        for collector in collectors:
            # Collectors written before the split declare no mandatory field.
            mandatory.update(getattr(collector, "mandatory_fields", ()))
            fields.update(collector.fields)
        return cls(frozenset(fields | mandatory), frozenset(mandatory))

    def missing(self, stats: Mapping[str, StatValue], properties: Mapping[str, Any]) -> list[str]:
        """The mandatory fields a sample lacks. ``None`` counts as lacking: these
        collectors answer None for what they could not read, where MOM's leave it out."""
        return sorted(
            f for f in self.mandatory if stats.get(f) is None and properties.get(f) is None
        )

    def unready(self, stats: Mapping[str, StatValue], properties: Mapping[str, Any]) -> str | None:
        """Why a sample is not ready (MOM's monitors' rule), or None when it is."""
        missing = self.missing(stats, properties)
        return f"mandatory {', '.join(missing)} missing" if missing else None


class _NoHypervisor:
    """What collectors built only for their declarations are given: they keep it and
    never call it (``policy eval --collectors`` reads a snapshot, not a host)."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"collectors built for their declarations read no hypervisor: {name}")


def declarations(selection: str | CollectorSet) -> tuple[Declaration, Declaration]:
    """What the host's and the guests' collectors of a selection declare, as the agent
    configured with it would see them. Raises ``ValueError`` as ``named_collectors``."""
    hosts, guests = named_collectors(
        selection, CollectorSources(cast("Hypervisor", _NoHypervisor()))
    )
    return Declaration.of(hosts), Declaration.of(guests)


def default_guest_collectors(
    hypervisor: Hypervisor, clock: Callable[[], float] = time.monotonic
) -> list[GuestCollector]:
    default = CollectorSet((), COLLECTOR_SETS[DEFAULT_COLLECTOR_SET].guest)
    return named_collectors(default, CollectorSources(hypervisor, clock=clock))[1]


def default_host_collectors(
    hypervisor: Hypervisor, proc_root: Path = Path("/proc")
) -> list[HostCollector]:
    default = CollectorSet(COLLECTOR_SETS[DEFAULT_COLLECTOR_SET].host, ())
    return named_collectors(default, CollectorSources(hypervisor, proc_root))[0]
