"""Which collectors run: the named sets (``loadmaster``, ``vdsm``, ``mom-libvirt``) or a
list of registered names, built from the entry points."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from loadmaster.agent.hypervisor.base import Hypervisor
from loadmaster.agent.sla.collectors.base import CollectorSources, GuestCollector, HostCollector
from loadmaster.agent.sla.collectors.declaration import Declaration
from loadmaster.agent.sla.plugins import GUEST_COLLECTOR_GROUP, HOST_COLLECTOR_GROUP, registered


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
