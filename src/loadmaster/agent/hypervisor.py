"""What the agent needs from a hypervisor, whatever drives it (libvirt or the simulator).

Every call either returns data or raises ``HypervisorError``; implementations translate
their own failures, so collectors and controllers need exactly one ``except``.
Memory sizes are KiB, CPU times nanoseconds, quota and period microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from loadmaster.errors import LoadmasterError

SLA_TIERS = ("platinum", "gold", "silver", "best-effort")
# The six IO limits MOM's IoTune objects carry; libvirt uses the same names.
IO_KEYS = (
    "total_bytes_sec",
    "read_bytes_sec",
    "write_bytes_sec",
    "total_iops_sec",
    "read_iops_sec",
    "write_iops_sec",
)
KSM_KEYS = (
    "run",
    "sleep_millisecs",
    "pages_shared",
    "pages_sharing",
    "pages_unshared",
    "pages_to_scan",
    "pages_volatile",
    "full_scans",
    "merge_across_nodes",
)


class HypervisorError(LoadmasterError):
    code = "loadmaster.hypervisor_error"
    title = "Hypervisor call failed"
    status = 502


@dataclass(frozen=True)
class GuestInfo:
    """A running guest. ``io_limits`` maps a disk to the maximum limits its IO policy allows;
    ``vcpu_user_limit`` is the share of the host's CPU the owner may use (%, 100 = all)."""

    uuid: str
    name: str
    tags: frozenset[str] = frozenset()
    vcpu_user_limit: float = 100.0
    disks: tuple[str, ...] = ()
    io_limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # True when loadmaster launched it (the <lm:managed/> marker): the only guests it removes.
    managed: bool = False


@dataclass(frozen=True)
class BalloonInfo:
    current: int
    maximum: int
    minimum: int


@dataclass(frozen=True)
class CpuStats:
    cpu_time_ns: int
    vcpu_count: int


@dataclass(frozen=True)
class CpuTune:
    """``None`` for a parameter the hypervisor does not expose."""

    quota: int | None
    period: int | None
    shares: int | None


@dataclass(frozen=True)
class BlockStats:
    rd_req: int
    rd_bytes: int
    wr_req: int
    wr_bytes: int


# -- guest lifecycle and host discovery ------------------------------------------------


@dataclass(frozen=True)
class GuestSpec:
    """What the agent launches: a flavor's size and the VM's API tags."""

    uuid: str
    name: str
    memory_kib: int
    vcpus: int
    tags: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NumaCell:
    id: int
    cpus: int
    memory_kib: int


@dataclass(frozen=True)
class HostInfo:
    """What the host has, as the hypervisor discovers it."""

    hostname: str
    cpus: int
    memory_kib: int
    free_memory_kib: int
    numa_cells: tuple[NumaCell, ...] = ()


# ----------------------------------------------------------------------------------------


class Hypervisor(Protocol):
    def list_guests(self) -> list[GuestInfo]: ...

    def memory_stats(self, uuid: str) -> Mapping[str, int]:
        """libvirt ``virDomainMemoryStats`` names: ``available``, ``unused``, ``usable``,
        ``swap_in``, ``swap_out``, ``major_fault``, ``minor_fault``, ``rss``; any may be absent."""
        ...

    def balloon_info(self, uuid: str) -> BalloonInfo: ...

    def set_memory(self, uuid: str, kib: int) -> None: ...

    def cpu_stats(self, uuid: str) -> CpuStats: ...

    def cpu_tune(self, uuid: str) -> CpuTune: ...

    def set_cpu_tune(
        self, uuid: str, *, quota: int | None, period: int | None, shares: int | None
    ) -> None:
        """Set the given parameters (``None`` leaves one as it is) in one call."""
        ...

    def block_stats(self, uuid: str, disk: str) -> BlockStats: ...

    def io_tune(self, uuid: str, disk: str) -> Mapping[str, int]: ...

    def set_io_tune(self, uuid: str, disk: str, limits: Mapping[str, int]) -> None: ...

    def stop_guest(self, uuid: str, *, force: bool) -> None:
        """Ask the guest to shut down, or pull the plug when ``force``."""
        ...

    def ksm_read(self) -> Mapping[str, int | None]:
        """The ``KSM_KEYS`` knobs and counters; ``None`` for one that cannot be read."""
        ...

    def ksm_write(self, key: str, value: int) -> None: ...

    # -- guest lifecycle and host discovery --------------------------------------------

    def host_info(self) -> HostInfo: ...

    def launch_guest(self, spec: GuestSpec) -> None:
        """Define (persistently) and start; idempotent: running already -> no-op, defined but
        off -> start. The domain carries loadmaster metadata: its tags and an <lm:managed/>
        marker."""
        ...

    def remove_guest(self, uuid: str) -> None:
        """Destroy and undefine; no-op when absent."""
        ...

    def set_tags(self, uuid: str, tags: frozenset[str]) -> None:
        """Rewrite the tags in the loadmaster metadata (live and persistent config)."""
        ...

    def migrate_guest(self, uuid: str, destination_uri: str) -> None:
        """Move the running guest to the hypervisor at destination_uri. On return it runs
        there and is gone here. On failure raise HypervisorError with the guest still
        running here (rolled back)."""
        ...


class SysfsKsm:
    """KSM as the kernel shows it under ``<sys_root>/kernel/mm/ksm``."""

    def __init__(self, sys_root: Path = Path("/sys")) -> None:
        self.directory = Path(sys_root) / "kernel" / "mm" / "ksm"

    def read(self) -> dict[str, int | None]:
        values: dict[str, int | None] = {}
        for key in KSM_KEYS:
            try:
                values[key] = int((self.directory / key).read_text().strip())
            except (OSError, ValueError):
                values[key] = None
        return values

    def write(self, key: str, value: int) -> None:
        if key not in KSM_KEYS:
            raise HypervisorError(f"unknown KSM knob {key!r}")
        try:
            (self.directory / key).write_text(f"{int(value)}\n")
        except OSError as exc:
            raise HypervisorError(f"cannot write KSM {key}={value}: {exc}") from exc
