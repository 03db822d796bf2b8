"""What a collector is: the host's and the guests' collector contracts, and what
collectors are built from."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from loadmaster.agent.hypervisor.base import GuestInfo, Hypervisor
from loadmaster.policy.snapshot import StatValue

Stats = dict[str, StatValue]


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


@dataclass(frozen=True)
class CollectorSources:
    """What collectors are built from."""

    hypervisor: Hypervisor
    proc_root: Path = Path("/proc")
    clock: Callable[[], float] = time.monotonic


# Fields a guest collector returns among its properties rather than its stats.
PROPERTY_FIELDS = ("io_tune",)
