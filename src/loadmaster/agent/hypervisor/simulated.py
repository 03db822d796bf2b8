"""A simulated host for demos, benchmarks and the knobs libvirt's test driver lacks.

Each guest's memory demand follows its own seeded curve (a base, a slow rise towards
``ramp_steps``, a wave and noise), so two simulators built with the same seed evolve
identically whatever the agent does to either. A guest holds ``min(demand, balloon)``
resident and swaps inside itself for the rest; the host swaps whatever its guests hold
beyond its memory. KSM, CPU tune and IO tune validate their input like the kernel and
libvirt do, so a controller sending a value they would refuse fails here too. Network
bandwidth and NUMA placement are only recorded and validated: they do not change the
simulated demand.

This module is the simulated hypervisor.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid as uuidlib
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from loadmaster.agent.hypervisor.base import (
    NET_DIRECTIONS,
    NET_KEYS,
    NET_LIMIT_MAX,
    NET_PARAMS,
    NUMA_MODES,
    PERIOD_MAX,
    PERIOD_MIN,
    QUOTA_MAX,
    QUOTA_MIN,
    SHARES_MAX,
    SHARES_MIN,
    BalloonInfo,
    BlockStats,
    CpuStats,
    CpuTune,
    DiskSpec,
    GuestInfo,
    GuestSpec,
    HostInfo,
    HypervisorError,
    MemoryKsm,
    NicSpec,
    NumaCell,
    NumaTune,
    format_nodeset,
    parse_nodeset,
)
from loadmaster.agent.hypervisor.devices import HostDevice, hostdev_elements
from loadmaster.policy.entities import IO_KEYS
from loadmaster.policy.snapshot import StatValue
from loadmaster.tiers import PRIORITY_PREFIX, tier_of

GIB = 1024 * 1024  # in KiB
PAGE_KIB = 4
# Share of a guest's resident memory KSM can merge at best (identical zero and OS pages).
KSM_MERGEABLE = 0.05
# The host OS and qemu overhead, outside any guest.
HOST_OVERHEAD_KIB = 2 * GIB
# Tier mix of ``SimulatedHypervisor.mixed``: (tier tag, share of the guests). Some vapor
# VMs use the ``best-effort`` alias, as VMs tagged before the design's name would.
TIER_MIX: tuple[tuple[str, float], ...] = (
    ("platinum", 0.15),
    ("gold", 0.25),
    ("silver", 0.15),
    ("compute", 0.15),
    ("vapor", 0.2),
    ("best-effort", 0.1),
)
# ``mixed`` gives guest i the priority i % PRIORITY_LEVELS within its tier.
PRIORITY_LEVELS = 3


@dataclass(frozen=True)
class SimGuestSpec:
    """A guest's size and demand curve; ``base`` and ``rise`` are fractions of its memory."""

    name: str
    memory_kib: int
    min_kib: int
    vcpus: int = 2
    tags: frozenset[str] = frozenset()
    base: float = 0.4
    rise: float = 0.4
    wave: float = 0.03
    vcpu_limit: float = 100.0
    io_limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    interfaces: int = 1


@dataclass
class _Guest:
    spec: SimGuestSpec
    uuid: str
    rng: random.Random
    phase: float
    balloon: int
    demand: int = 0
    guest_swap: int = 0
    swap_in: int = 0
    swap_out: int = 0
    major_fault: int = 0
    cpu_time_ns: int = 0
    quota: int = -1
    period: int = 100_000
    shares: int = 1024
    rd_bytes: int = 0
    wr_bytes: int = 0
    io_tune: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IO_KEYS, 0))
    shutting_down: bool = False
    managed: bool = False
    interfaces: dict[str, dict[str, int]] = field(default_factory=dict)
    # What it was launched with (a guest of the simulator's own list has neither).
    disk: DiskSpec | None = None
    nics: tuple[NicSpec, ...] = ()
    # No <numatune> in the domain: libvirt reports strict mode over any node.
    numa: NumaTune = field(default_factory=lambda: NumaTune("strict", ""))
    # The host devices the agent gave it.
    host_devices: tuple[HostDevice, ...] = ()

    @property
    def resident(self) -> int:
        return min(self.demand, self.balloon)


class SimulatedHypervisor:
    """Guest lifecycle knobs: ``launch_delay`` seconds each launch takes (blocking the
    caller, like a real define and boot); ``failing_launches`` UUIDs or names whose launch
    raises; ``uri`` makes this host a migration destination for the other simulators of
    the process (``serve_at``). ``numa_nodes`` splits CPUs and memory into equal cells.
    ``networks`` are the networks NICs may join, ``images`` the base images disks may be
    made of (None: any); a launch naming another is refused, as on libvirt."""

    # Simulators that accept migrations, by URI (weak: a dropped simulator stops serving).
    _serving: ClassVar[weakref.WeakValueDictionary[str, SimulatedHypervisor]] = (
        weakref.WeakValueDictionary()
    )

    def __init__(
        self,
        guests: Sequence[SimGuestSpec],
        *,
        host_memory_kib: int,
        cpus: int = 32,
        seed: int = 0,
        ramp_steps: int = 100,
        step_seconds: float = 10.0,
        hostname: str = "sim-host",
        uri: str | None = None,
        launch_delay: float = 0.0,
        failing_launches: Collection[str] = (),
        numa_nodes: int = 1,
        node_devices: Sequence[str] = (),
        networks: Collection[str] = ("default",),
        images: Collection[str] | None = None,
    ) -> None:
        self.hostname = hostname
        # libvirt node-device descriptions of the host's devices (``DeviceSource``).
        self.node_devices = list(node_devices)
        self.networks = frozenset(networks)
        self.images = None if images is None else frozenset(images)
        self.launch_delay = launch_delay
        self.failing_launches: set[str] = set(failing_launches)
        self.numa_nodes = max(1, numa_nodes)
        # Launches and migrations may come from the agent's worker threads.
        self._lifecycle_lock = threading.RLock()
        self.uri: str | None = None
        if uri is not None:
            self.serve_at(uri)
        self.host_memory_kib = host_memory_kib
        self.cpus = cpus
        self.ramp_steps = max(1, ramp_steps)
        self.step_seconds = step_seconds
        self.step = 0
        self.cpu_load = 0.0
        rng = random.Random(seed)
        self._guests: dict[str, _Guest] = {}
        nics = 0
        for spec in guests:
            uuid = str(uuidlib.UUID(int=rng.getrandbits(128), version=4))
            guest_rng = random.Random(rng.getrandbits(64))
            guest = _Guest(
                spec, uuid, guest_rng, guest_rng.uniform(0, 2 * math.pi), spec.memory_kib
            )
            # Host-wide tap names, as libvirt gives them (vnet0, vnet1, ...).
            for _ in range(spec.interfaces):
                guest.interfaces[f"vnet{nics}"] = dict.fromkeys(NET_KEYS, 0)
                nics += 1
            self._guests[uuid] = guest
        # KSM of this made-up host, never the machine's own.
        self._ksm = MemoryKsm()
        self.ksm = self._ksm.values
        self.ksm_writes = self._ksm.writes
        # Method names that raise, to test how the agent lives with a failing hypervisor.
        self.broken: set[str] = set()
        self.stopped: list[str] = []
        self._update_memory()

    @classmethod
    def mixed(
        cls,
        guests: int,
        *,
        seed: int = 0,
        overcommit: float = 1.5,
        ramp_steps: int = 100,
        step_seconds: float = 10.0,
    ) -> SimulatedHypervisor:
        """``guests`` VMs of 2-8 GiB in ``TIER_MIX`` proportions on a host whose memory is
        their total size divided by ``overcommit``; demand rises from ~40 % to ~85 %."""
        rng = random.Random(seed)
        specs = []
        tiers = [tag for tag, share in TIER_MIX for _ in range(round(share * 100))]
        for i in range(guests):
            tags = frozenset(
                {tiers[(i * 37) % len(tiers)], f"{PRIORITY_PREFIX}{i % PRIORITY_LEVELS}"}
            )
            memory = rng.choice([2, 4, 4, 8]) * GIB
            specs.append(
                SimGuestSpec(
                    name=f"vm-{i:04d}",
                    memory_kib=memory,
                    min_kib=memory // 4,
                    vcpus=rng.choice([1, 2, 4]),
                    tags=tags,
                    base=rng.uniform(0.3, 0.5),
                    rise=rng.uniform(0.35, 0.45),
                    vcpu_limit=rng.choice([25.0, 50.0, 100.0, 100.0]),
                    io_limits={"vda": {**dict.fromkeys(IO_KEYS, 0), "total_iops_sec": 2000}},
                )
            )
        total = sum(s.memory_kib for s in specs)
        return cls(
            specs,
            host_memory_kib=int(total / overcommit) + HOST_OVERHEAD_KIB,
            cpus=max(8, sum(s.vcpus for s in specs) // 2),
            seed=seed,
            ramp_steps=ramp_steps,
            step_seconds=step_seconds,
        )

    # -- time --------------------------------------------------------------------------

    def clock(self) -> float:
        return self.step * self.step_seconds

    def advance(self) -> None:
        """One step of simulated time: demand moves, guests run, KSM scans."""
        self.step += 1
        for guest in self._running():
            if guest.shutting_down:
                self._remove(guest)
        ramp = min(1.0, self.step / self.ramp_steps)
        busy = 0.0
        for g in self._running():
            s = g.spec
            wave = s.wave * math.sin(2 * math.pi * self.step / 40 + g.phase)
            fraction = s.base + s.rise * ramp + wave + g.rng.gauss(0, 0.01)
            g.demand = int(s.memory_kib * min(0.98, max(0.05, fraction)))
            swapped = max(0, g.demand - g.balloon)
            pages = abs(swapped - g.guest_swap) // PAGE_KIB
            if swapped > g.guest_swap:
                g.swap_out += pages
            else:
                g.swap_in += pages
            g.major_fault += pages
            g.guest_swap = swapped
            util = min(1.0, max(0.0, 0.3 + g.rng.gauss(0, 0.15)))
            if g.quota > 0:
                util = min(util, g.quota / g.period)
            g.cpu_time_ns += int(util * s.vcpus * self.step_seconds * 1e9)
            busy += util * s.vcpus
            g.rd_bytes += g.rng.randrange(0, 50_000_000)
            g.wr_bytes += g.rng.randrange(0, 20_000_000)
        self.cpu_load = min(1.0, busy / self.cpus)
        self._scan_ksm()
        self._update_memory()

    def _scan_ksm(self) -> None:
        if self.ksm["run"] != 1:
            return
        resident_pages = sum(g.resident for g in self._running()) // PAGE_KIB
        cap = int(KSM_MERGEABLE * resident_pages)
        scans = self.step_seconds * 1000 / max(1, self.ksm["sleep_millisecs"])
        merged = int(self.ksm["pages_to_scan"] * scans * KSM_MERGEABLE)
        sharing = min(cap, self.ksm["pages_sharing"] + merged)
        self.ksm["pages_sharing"] = sharing
        self.ksm["pages_shared"] = sharing // 4
        self.ksm["full_scans"] += 1

    def _update_memory(self) -> None:
        saved = (self.ksm["pages_sharing"] - self.ksm["pages_shared"]) * PAGE_KIB
        used = HOST_OVERHEAD_KIB + sum(g.resident for g in self._running()) - saved
        self.host_used_kib = max(0, used)
        self.host_swap_kib = max(0, used - self.host_memory_kib)

    def _running(self) -> list[_Guest]:
        """The guests, copied in one step: launches and migrations may add or drop guests
        from other threads while a caller goes through them."""
        return list(self._guests.values())

    def _remove(self, guest: _Guest) -> None:
        if self._guests.pop(guest.uuid, None) is None:
            return  # removed by another caller meanwhile
        self.stopped.append(guest.spec.name)
        self._update_memory()

    # -- observations for the simulation report ----------------------------------------

    def balloon_ratios(self) -> dict[str, list[float]]:
        """Balloon / allocation of every running guest, by SLA tier name."""
        ratios: dict[str, list[float]] = {}
        for g in self._running():
            tier = tier_of(g.spec.tags).name
            ratios.setdefault(tier, []).append(g.balloon / g.spec.memory_kib)
        return ratios

    def guest_swap_kib(self) -> int:
        return sum(g.guest_swap for g in self._running())

    def host_stats(self) -> dict[str, StatValue]:
        free = max(0, self.host_memory_kib - self.host_used_kib)
        return {
            "mem_available": self.host_memory_kib,
            "mem_unused": free,
            "mem_free": free,
            "swap_total": 64 * GIB,
            "swap_usage": self.host_swap_kib,
            "cpu_count": self.cpus,
            "cpu_load": self.cpu_load,
        }

    # -- the Hypervisor protocol -------------------------------------------------------

    def _check(self, call: str) -> None:
        if call in self.broken:
            raise HypervisorError(f"{call}: simulated failure")

    def _guest(self, uuid: str) -> _Guest:
        guest = self._guests.get(uuid)
        if guest is None:
            raise HypervisorError(f"no running guest {uuid}")
        return guest

    def list_guests(self) -> list[GuestInfo]:
        self._check("list_guests")
        return [
            GuestInfo(
                g.uuid,
                g.spec.name,
                g.spec.tags,
                g.spec.vcpu_limit,
                tuple(g.spec.io_limits) or ("vda",),
                g.spec.io_limits,
                tuple(g.interfaces),
                managed=g.managed,
            )
            for g in self._running()
        ]

    def memory_stats(self, uuid: str) -> Mapping[str, int]:
        self._check("memory_stats")
        g = self._guest(uuid)
        unused = g.balloon - g.resident
        return {
            "actual": g.balloon,
            "available": g.balloon,
            "unused": unused,
            "usable": unused,
            "swap_in": g.swap_in,
            "swap_out": g.swap_out,
            "major_fault": g.major_fault,
            "minor_fault": g.major_fault * 10,
            "rss": g.resident,
        }

    def balloon_info(self, uuid: str) -> BalloonInfo:
        self._check("balloon_info")
        g = self._guest(uuid)
        return BalloonInfo(g.balloon, g.spec.memory_kib, g.spec.min_kib)

    def set_memory(self, uuid: str, kib: int) -> None:
        self._check("set_memory")
        g = self._guest(uuid)
        if not 0 < kib <= g.spec.memory_kib:
            raise HypervisorError(f"setMemory {kib} KiB outside (0, {g.spec.memory_kib}]")
        g.balloon = kib
        self._update_memory()

    def cpu_stats(self, uuid: str) -> CpuStats:
        self._check("cpu_stats")
        g = self._guest(uuid)
        return CpuStats(g.cpu_time_ns, g.spec.vcpus)

    def cpu_tune(self, uuid: str) -> CpuTune:
        self._check("cpu_tune")
        g = self._guest(uuid)
        return CpuTune(g.quota, g.period, g.shares)

    def set_cpu_tune(
        self, uuid: str, *, quota: int | None, period: int | None, shares: int | None
    ) -> None:
        self._check("set_cpu_tune")
        g = self._guest(uuid)
        # libvirt's checks: a negative quota is "unlimited", 0 and small values are refused.
        if quota is not None and quota >= 0 and not QUOTA_MIN <= quota <= QUOTA_MAX:
            raise HypervisorError(f"vcpu_quota {quota} out of range")
        if period is not None and not PERIOD_MIN <= period <= PERIOD_MAX:
            raise HypervisorError(f"vcpu_period {period} out of range")
        if shares is not None and not SHARES_MIN <= shares <= SHARES_MAX:
            raise HypervisorError(f"cpu_shares {shares} out of range")
        if quota is not None:
            g.quota = quota
        if period is not None:
            g.period = period
        if shares is not None:
            g.shares = shares

    def block_stats(self, uuid: str, disk: str) -> BlockStats:
        self._check("block_stats")
        g = self._guest(uuid)
        return BlockStats(g.rd_bytes // 65536, g.rd_bytes, g.wr_bytes // 65536, g.wr_bytes)

    def io_tune(self, uuid: str, disk: str) -> Mapping[str, int]:
        self._check("io_tune")
        return dict(self._guest(uuid).io_tune)

    def set_io_tune(self, uuid: str, disk: str, limits: Mapping[str, int]) -> None:
        self._check("set_io_tune")
        g = self._guest(uuid)
        if any(k not in IO_KEYS or v < 0 for k, v in limits.items()):
            raise HypervisorError(f"invalid IO limits {dict(limits)}")
        g.io_tune.update(limits)

    def stop_guest(self, uuid: str, *, force: bool) -> None:
        self._check("stop_guest")
        g = self._guest(uuid)
        if force:
            self._remove(g)
        else:
            g.shutting_down = True

    def ksm_read(self) -> Mapping[str, int | None]:
        self._check("ksm_read")
        return dict(self.ksm)

    def ksm_write(self, key: str, value: int) -> None:
        self._check("ksm_write")
        self._ksm.write(key, value)
        # An unmerge gives the merged pages back to the guests.
        self._update_memory()

    # -- network bandwidth and NUMA memory tuning ----------------------------------------

    def _interface(self, uuid: str, interface: str) -> dict[str, int]:
        limits = self._guest(uuid).interfaces.get(interface)
        if limits is None:
            raise HypervisorError(f"invalid argument: {interface!r} is not a known interface")
        return limits

    def interface_bandwidth(self, uuid: str, interface: str) -> Mapping[str, int]:
        self._check("interface_bandwidth")
        return dict(self._interface(uuid, interface))

    def set_interface_bandwidth(self, uuid: str, interface: str, limits: Mapping[str, int]) -> None:
        self._check("set_interface_bandwidth")
        current = self._interface(uuid, interface)
        for key, value in limits.items():
            if key not in NET_KEYS:
                raise HypervisorError(f"unsupported interface parameter {key!r}")
            if not 0 <= value <= NET_LIMIT_MAX:
                raise HypervisorError(f"{key} {value} out of range [0, {NET_LIMIT_MAX}]")
        current.update(limits)
        # As libvirt does: a direction without an average has no limit at all.
        for direction in NET_DIRECTIONS:
            if current[f"{direction}.average"] == 0:
                current.update({f"{direction}.{p}": 0 for p in NET_PARAMS})

    def numa_tune(self, uuid: str) -> NumaTune:
        self._check("numa_tune")
        return self._guest(uuid).numa

    def set_numa_tune(self, uuid: str, *, mode: str | None, nodeset: str | None) -> None:
        self._check("set_numa_tune")
        g = self._guest(uuid)
        # QEMU's rules for a running guest (qemuDomainSetNumaParameters).
        if mode is not None and mode != g.numa.mode:
            if mode not in NUMA_MODES:
                raise HypervisorError(f"unsupported numa_mode {mode!r}")
            raise HypervisorError("can't change numatune mode for running domain")
        if nodeset is None:
            return
        if g.numa.mode not in ("strict", "restrictive"):
            raise HypervisorError(
                "change of nodeset for running domain requires strict or restrictive numa mode"
            )
        try:
            nodes = parse_nodeset(nodeset)
        except ValueError as exc:
            raise HypervisorError(f"invalid nodeset: {exc}") from exc
        if max(nodes) >= self.numa_nodes:
            raise HypervisorError(f"NUMA node {max(nodes)} is unavailable")
        g.numa = NumaTune(g.numa.mode, format_nodeset(nodes))

    # -- guest lifecycle and host discovery --------------------------------------------

    def serve_at(self, uri: str) -> None:
        """Accept migrations sent to ``uri`` by any simulator of this process."""
        self.uri = uri
        SimulatedHypervisor._serving[uri] = self

    def host_info(self) -> HostInfo:
        self._check("host_info")
        n = self.numa_nodes
        cells = tuple(
            NumaCell(i, self.cpus // n + (i < self.cpus % n), self.host_memory_kib // n)
            for i in range(n)
        )
        free = max(0, self.host_memory_kib - self.host_used_kib)
        return HostInfo(self.hostname, self.cpus, self.host_memory_kib, free, cells)

    def launch_guest(self, spec: GuestSpec) -> None:
        self._check("launch_guest")
        if self._restart(spec.uuid):
            return
        if spec.uuid in self.failing_launches or spec.name in self.failing_launches:
            raise HypervisorError(f"launch {spec.name} ({spec.uuid}): simulated failure")
        self._check_devices(spec)
        if self.launch_delay > 0:
            time.sleep(self.launch_delay)
        with self._lifecycle_lock:
            if self._restart(spec.uuid):  # launched by another caller while this one slept
                return
            self._guests[spec.uuid] = launched_guest(spec)
            self._update_memory()

    # -- the host's devices (a ``devices.DeviceSource``) --------------------------------
    def node_device_xmls(self) -> list[str]:
        return list(self.node_devices)

    def guest_xmls(self) -> dict[str, str]:
        """Each guest's devices as the domain XML would name them."""
        with self._lifecycle_lock:
            guests = list(self._guests.values())
        out = {}
        for guest in guests:
            dom = ET.Element("domain")
            hostdev_elements(ET.SubElement(dom, "devices"), guest.host_devices)
            out[guest.uuid] = ET.tostring(dom, encoding="unicode")
        return out

    def _check_devices(self, spec: GuestSpec) -> None:
        what = f"launch {spec.name} ({spec.uuid})"
        for nic in spec.nics:
            if nic.network not in self.networks:
                raise HypervisorError(
                    f"{what}: network {nic.network!r} is not defined on this host "
                    f"(defined: {', '.join(sorted(self.networks)) or 'none'})"
                )
        image = spec.disk.image if spec.disk is not None else None
        if image is not None and self.images is not None and image not in self.images:
            raise HypervisorError(f"{what}: image {image!r} is not on this host")

    def disks(self) -> dict[str, DiskSpec]:
        """The disks of the guests here, by guest."""
        with self._lifecycle_lock:
            return {u: g.disk for u, g in self._guests.items() if g.disk is not None}

    def nics(self) -> dict[str, tuple[NicSpec, ...]]:
        """The NICs of the guests here that have any, by guest."""
        with self._lifecycle_lock:
            return {u: g.nics for u, g in self._guests.items() if g.nics}

    def _restart(self, uuid: str) -> bool:
        """True when the guest is here already; a graceful stop not yet done is called
        off, as starting a domain that is shutting down would."""
        with self._lifecycle_lock:
            guest = self._guests.get(uuid)
            if guest is None:
                return False
            guest.shutting_down = False
            return True

    def stopped_guests(self) -> list[str]:
        """None: a simulated guest is either running or gone."""
        return []

    def remove_guest(self, uuid: str, *, keep_disk: bool = False) -> None:
        self._check("remove_guest")
        with self._lifecycle_lock:
            if self._guests.pop(uuid, None) is not None:
                self._update_memory()

    def set_tags(self, uuid: str, tags: frozenset[str]) -> None:
        self._check("set_tags")
        guest = self._guest(uuid)
        guest.spec = replace(guest.spec, tags=frozenset(tags))

    def set_host_devices(self, uuid: str, devices: Sequence[HostDevice]) -> None:
        """As libvirt would: a PCI function another guest here holds is refused."""
        self._check("set_host_devices")
        with self._lifecycle_lock:
            guest = self._guest(uuid)
            others = {
                d.address
                for g in self._guests.values()
                if g is not guest
                for d in g.host_devices
                if d.mdev_type is None
            }
            for device in devices:
                if device.mdev_type is None and device.address in others:
                    raise HypervisorError(
                        f"plug {device.address} into {uuid}: another guest holds it"
                    )
            guest.host_devices = tuple(devices)

    def migrate_guest(self, uuid: str, destination_uri: str) -> None:
        """Moves the guest, with its balloon, counters and demand curve, to the simulator
        serving ``destination_uri``. ``broken`` holding "migrate_guest" here, or
        "receive_guest" there, makes it fail with the guest still here; so does a guest
        holding host devices, as QEMU refuses to migrate VFIO devices."""
        self._check("migrate_guest")
        guest = self._guest(uuid)
        if guest.host_devices:
            raise HypervisorError(
                f"migrate {uuid}: it holds host devices "
                f"({', '.join(d.address for d in guest.host_devices)}), which cannot migrate"
            )
        destination = SimulatedHypervisor._serving.get(destination_uri)
        if destination is None or destination is self:
            raise HypervisorError(
                f"migrate {uuid} to {destination_uri}: no other simulated host serves it"
            )
        destination._receive(guest, destination_uri)
        with self._lifecycle_lock:
            self._guests.pop(uuid, None)
            self._update_memory()

    def _receive(self, guest: _Guest, uri: str) -> None:
        self._check("receive_guest")
        with self._lifecycle_lock:
            if guest.uuid in self._guests:
                raise HypervisorError(f"migrate {guest.uuid} to {uri}: already there")
            self._guests[guest.uuid] = guest
            self._update_memory()


def launched_guest(spec: GuestSpec) -> _Guest:
    """A guest launched from a ``GuestSpec``: the default demand curve, a quarter of its
    memory as balloon minimum, randomness seeded by its UUID (the same on every run)."""
    rng = random.Random(spec.uuid)
    sim_spec = SimGuestSpec(
        name=spec.name,
        memory_kib=spec.memory_kib,
        min_kib=spec.memory_kib // 4,
        vcpus=spec.vcpus,
        tags=spec.tags,
    )
    guest = _Guest(
        sim_spec,
        spec.uuid,
        rng,
        rng.uniform(0, 2 * math.pi),
        spec.memory_kib,
        managed=True,
        host_devices=spec.host_devices,
        disk=spec.disk,
        nics=spec.nics,
    )
    # The flavor's quota, as libvirt applies it at start; of the disk's, the six limits
    # the simulator keeps.
    guest.io_tune.update((k, v) for k, v in spec.quota.disk.items() if k in IO_KEYS)
    cpu = spec.quota.cpu
    guest.shares = cpu.get("shares", guest.shares)
    guest.period = cpu.get("period", guest.period)
    guest.quota = cpu.get("quota", guest.quota)
    return guest
