"""What the agent needs from a hypervisor, whatever drives it (libvirt or the simulator).

Every call either returns data or raises ``HypervisorError``; implementations translate
their own failures, so collectors and controllers need exactly one ``except``.
Memory sizes are KiB, CPU times nanoseconds, quota and period microseconds, network
averages and peaks KiB/s, bursts KiB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from loadmaster.agent.hypervisor.devices import HostDevice
from loadmaster.errors import LoadmasterError
from loadmaster.quota import Quota

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
# Where the kernel's sysfs is on a real host. Only a real hypervisor connection may use
# it by default; see ``ksm_for``.
DEFAULT_SYS_ROOT = Path("/sys")


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
    # Network interfaces by the name libvirt's interface calls take (the target dev).
    interfaces: tuple[str, ...] = ()
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
class DiskSpec:
    """A guest's disk: a copy-on-write overlay of the base ``image`` (None: a blank disk)
    of ``size_bytes``, the VM's DISK_GB."""

    image: str | None
    size_bytes: int


@dataclass(frozen=True)
class NicSpec:
    """A virtio NIC on the host's network ``network``, with the MAC the ledger keeps for
    the VM wherever it runs."""

    network: str
    mac: str


# The guest's kernel command line when none is given: console on the serial port, and a
# kernel that panics reboots rather than hanging.
DEFAULT_GUEST_CMDLINE = "console=ttyS0 panic=1"


@dataclass(frozen=True)
class GuestImage:
    """How a QEMU guest boots: direct kernel boot (the initramfs makes the guest's disk its
    root when the disk has one). ``log_dir`` receives each guest's serial console as
    ``<name>.serial`` (None: no serial port)."""

    kernel: Path
    initrd: Path
    cmdline: str = DEFAULT_GUEST_CMDLINE
    log_dir: Path | None = None


@dataclass(frozen=True)
class GuestSpec:
    """What the agent launches: a flavor's size, the VM's API tags, its disk and NICs."""

    uuid: str
    name: str
    memory_kib: int
    vcpus: int
    tags: frozenset[str] = frozenset()
    disk: DiskSpec | None = None
    nics: tuple[NicSpec, ...] = ()
    # The host's devices the agent gave it (agent/hypervisor/devices.py).
    host_devices: tuple[HostDevice, ...] = ()
    # Its flavor's disk, NIC and CPU limits.
    quota: Quota = field(default_factory=Quota)


@dataclass(frozen=True)
class NumaCell:
    id: int
    cpus: int
    memory_kib: int


@dataclass(frozen=True)
class SharedPool:
    """A storage pool several hosts mount, by the name the operator gave it on each, and
    its size: one DISK_GB for all of them (a sharing provider), not one per host."""

    name: str
    disk_gb: int


@dataclass(frozen=True)
class HostInfo:
    """What the host has, as the hypervisor discovers it."""

    hostname: str
    cpus: int
    memory_kib: int
    free_memory_kib: int
    numa_cells: tuple[NumaCell, ...] = ()
    # What the host's storage pool for guest disks holds (None: the driver has none, or
    # the pool is shared).
    disk_gb: int | None = None
    shared_pool: SharedPool | None = None


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
        marker. An image or a network the host does not have is refused, naming it; a
        launch that fails leaves no disk behind."""
        ...

    def remove_guest(self, uuid: str, *, keep_disk: bool = False) -> None:
        """Destroy and undefine, and delete its disk (kept on a shared pool with
        ``keep_disk``: the guest runs on from it elsewhere); no-op when absent."""
        ...

    def stopped_guests(self) -> list[str]:
        """UUIDs of the guests loadmaster launched (managed) that are defined here but not
        running: a launch or a move cut short between its steps can leave one."""
        ...

    def set_tags(self, uuid: str, tags: frozenset[str]) -> None:
        """Rewrite the tags in the loadmaster metadata (live and persistent config)."""
        ...

    def migrate_guest(self, uuid: str, destination_uri: str) -> None:
        """Move the running guest to the hypervisor at destination_uri. On return it runs
        there and is gone here. On failure raise HypervisorError with the guest still
        running here (rolled back)."""
        ...

    def set_host_devices(self, uuid: str, devices: Sequence[HostDevice]) -> None:
        """Make the running guest hold exactly ``devices`` of the host's devices (those the
        agent gave it, ``HostDevice.alias`` naming each), live and in its definition:
        unplug the others, plug in the new ones. A migration unplugs them first, as a
        guest holding VFIO devices cannot move, and the destination plugs in its own."""
        ...

    # -- network bandwidth and NUMA memory tuning ----------------------------------------

    def interface_bandwidth(self, uuid: str, interface: str) -> Mapping[str, int]:
        """The ``NET_KEYS`` limits of one interface (0 = no limit)."""
        ...

    def set_interface_bandwidth(self, uuid: str, interface: str, limits: Mapping[str, int]) -> None:
        """Set the given ``NET_KEYS`` limits of one interface, live."""
        ...

    def numa_tune(self, uuid: str) -> NumaTune: ...

    def set_numa_tune(self, uuid: str, *, mode: str | None, nodeset: str | None) -> None:
        """Set the memory placement mode and/or node set (``None`` leaves one), live."""
        ...


class Ksm(Protocol):
    """Where a hypervisor reads and writes the KSM knobs."""

    def read(self) -> dict[str, int | None]: ...

    def write(self, key: str, value: int) -> None: ...


class SysfsKsm:
    """KSM as the kernel shows it under ``<sys_root>/kernel/mm/ksm``. The root is always
    given: writing the machine's own /sys must be a decision (see ``ksm_for``)."""

    def __init__(self, sys_root: Path) -> None:
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


class MemoryKsm:
    """KSM knobs held in memory, refusing what the kernel refuses: for the libvirt test
    driver and the simulator, whose hosts are not this machine. The simulator's page
    scanner updates the counters in ``values`` directly."""

    def __init__(self) -> None:
        # The kernel's defaults on a fresh boot.
        self.values: dict[str, int] = {
            "run": 0,
            "sleep_millisecs": 20,
            "pages_shared": 0,
            "pages_sharing": 0,
            "pages_unshared": 0,
            "pages_to_scan": 100,
            "pages_volatile": 0,
            "full_scans": 0,
            "merge_across_nodes": 1,
        }
        self.writes: list[tuple[str, int]] = []

    def read(self) -> dict[str, int | None]:
        return dict(self.values)

    def write(self, key: str, value: int) -> None:
        if key not in KSM_KEYS:
            raise HypervisorError(f"unknown KSM knob {key!r}")
        if key == "merge_across_nodes" and self.values["pages_shared"] > 0:
            raise HypervisorError("merge_across_nodes: Device or resource busy (pages shared)")
        if key == "run" and value == 2:
            self.values["pages_shared"] = self.values["pages_sharing"] = 0
        self.values[key] = int(value)
        self.writes.append((key, int(value)))


def is_test_driver(uri: str) -> bool:
    """libvirt's test driver (``test:///default``, ``test:///path/to/host.xml``): a
    made-up host, whatever machine the agent runs on."""
    return uri.split(":", 1)[0].split("+", 1)[0] == "test"


def unreachable_destination(uri: str, own_uri: str) -> str | None:
    """Why a migration from the hypervisor ``own_uri`` cannot reach ``uri`` (None: it
    may). libvirt's test driver without a transport (``test:///default``) lives inside the
    process that opened it: another host's agent opening that URI gets a test host of its
    own, or its very own one, and a move there would stop the guest for nothing. A
    destination URI equal to this host's reaches this host's own hypervisor."""
    parts = urlsplit(uri)
    if parts.scheme == "test" and not parts.netloc:
        return (
            f"its hypervisor {uri} is libvirt's test driver inside its agent's own process, "
            "which no other process can reach (serve the test driver from a libvirtd and give "
            "each agent its test+unix:///default?socket=... URI)"
        )
    if uri == own_uri:
        return (
            f"it registered this host's own hypervisor URI {uri}, which reaches this host, "
            "not that one (set host.migration_uri in each agent's --config to the URI other "
            "hosts reach it by)"
        )
    return None


def ksm_for(uri: str, sys_root: Path | None) -> Ksm:
    """KSM for a hypervisor connection: under ``sys_root`` when one is given; otherwise
    the machine's own /sys for a real driver, and in memory for the test driver, so a
    test or demo can never change the KSM of the machine it runs on."""
    if sys_root is not None:
        return SysfsKsm(sys_root)
    if is_test_driver(uri):
        return MemoryKsm()
    return SysfsKsm(DEFAULT_SYS_ROOT)


# -- CPU tune -----------------------------------------------------------------------------

# libvirt's accepted ranges (virsh schedinfo): a negative quota means "no limit".
QUOTA_UNLIMITED = -1
QUOTA_MIN, QUOTA_MAX = 1000, 17_592_186_044_415
PERIOD_MIN, PERIOD_MAX = 1000, 1_000_000
SHARES_MIN, SHARES_MAX = 2, 262_144


# -- network bandwidth and NUMA memory tuning ---------------------------------------------

NET_DIRECTIONS = ("inbound", "outbound")
NET_PARAMS = ("average", "peak", "burst")
# libvirt's interface parameter names (``inbound.average``, ...), the keys of every
# bandwidth mapping here.
NET_KEYS: tuple[str, ...] = tuple(f"{d}.{p}" for d in NET_DIRECTIONS for p in NET_PARAMS)
# libvirt stores the limits as unsigned ints.
NET_LIMIT_MAX = 2**32 - 1
# Memory placement modes, in the order of libvirt's virDomainNumatuneMemMode enum.
NUMA_MODES = ("strict", "preferred", "interleave", "restrictive")


@dataclass(frozen=True)
class NumaTune:
    """``mode`` one of ``NUMA_MODES``; ``nodeset`` in libvirt's canonical form ("0-1,3"),
    "" when the memory may come from any node."""

    mode: str
    nodeset: str


def parse_nodeset(text: str) -> frozenset[int]:
    """libvirt's node set syntax: ``0-3,^2,5`` (ranges, single nodes, ``^`` excludes).
    Raises ValueError on anything else."""
    included: set[int] = set()
    excluded: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError(f"empty element in node set {text!r}")
        target = excluded if part.startswith("^") else included
        first, dash, last = part.lstrip("^").partition("-")
        if not (first + last).isascii() or not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"bad node set element {part!r}")
        low, high = int(first), int(last or first)
        if low > high:
            raise ValueError(f"bad node range {part!r}")
        target.update(range(low, high + 1))
    nodes = included - excluded
    if not nodes:
        raise ValueError(f"node set {text!r} names no node")
    return frozenset(nodes)


def format_nodeset(nodes: frozenset[int]) -> str:
    """The canonical form libvirt reports, so a requested and a read-back set compare."""
    ranges: list[str] = []
    for node in sorted(nodes):
        if ranges and node - 1 == int(ranges[-1].rsplit("-", 1)[-1]):
            ranges[-1] = f"{ranges[-1].split('-', 1)[0]}-{node}"
        else:
            ranges.append(str(node))
    return ",".join(ranges)
