"""The hypervisor interface over the libvirt Python binding.

VM tags and policy facts live in the domain's metadata, in loadmaster's namespace::

    <metadata>
      <lm:vm xmlns:lm="https://loadmaster.dev/xmlns/vm/1">
        <lm:tag>gold</lm:tag>
        <lm:vcpu-limit>50</lm:vcpu-limit>
        <lm:io-limit dev="vda" total_bytes_sec="52428800" total_iops_sec="2000"/>
      </lm:vm>
    </metadata>

An ``io-limit`` names a disk by its target or its source file; one the guest does not
have is ignored. A guest loadmaster launched also carries ``<lm:managed/>`` in that
element; the agent only ever removes such guests. Its flavor's NIC quota rides there too,
``<lm:nic-limit inbound.average="1024" .../>`` (KiB/s, KiB): libvirt cannot take it in the
domain XML on kernels without its modules, so the agent applies it to each NIC whenever
it first sees the guest run (launched, restarted, migrated in, or on its own start).
The flavor's disk and CPU quota are the disk's ``<iotune>`` and the domain's
``<cputune>``, applied by libvirt.

KSM is not a libvirt feature: it is read and written in sysfs under ``sys_root``, or, for
the test driver without a ``sys_root``, in memory (``ksm_for``): a test driver host is
made up, and must never change the KSM of the machine the agent runs on.

This module is the hypervisor interface over libvirt.
"""

from __future__ import annotations

import contextlib
import logging
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from loadmaster.agent.hypervisor import GuestImage, GuestInfo, GuestSpec, HypervisorError
from loadmaster.agent.hypervisor.base import (
    NET_KEYS,
    NUMA_MODES,
    BalloonInfo,
    BlockStats,
    CpuStats,
    CpuTune,
    HostInfo,
    NumaCell,
    NumaTune,
    SharedPool,
    is_test_driver,
    ksm_for,
)
from loadmaster.agent.hypervisor.devices import (
    HostDevice,
    given_aliases,
    hostdev_element,
    hostdev_elements,
)
from loadmaster.agent.hypervisor.networks import interface_element, require_networks
from loadmaster.agent.hypervisor.shaping import ShapingError, TapShaper, libvirt_can_shape
from loadmaster.agent.hypervisor.storage import GuestStorage, StorageConfig, disk_element
from loadmaster.images import volume_name
from loadmaster.policy.entities import IO_KEYS

if TYPE_CHECKING:
    from loadmaster.agent.hypervisor.registry import DriverOptions

log = logging.getLogger(__name__)

METADATA_NS = "https://loadmaster.dev/xmlns/vm/1"
NIC_LIMIT = "nic-limit"
# How often the balloon driver refreshes guest memory stats, in seconds.
MEMORY_STATS_PERIOD = 5

T = TypeVar("T")


def _import_libvirt() -> Any:
    try:
        import libvirt
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise HypervisorError(
            "the libvirt Python binding is not installed (pip install loadmaster[libvirt])"
        ) from exc
    return libvirt


def parse_metadata(xml: str | None) -> tuple[frozenset[str], float, dict[str, dict[str, int]]]:
    """Tags, vCPU limit (%) and per-disk IO maxima from a ``<lm:vm>`` element."""
    if not xml:
        return frozenset(), 100.0, {}
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise HypervisorError(f"malformed loadmaster metadata: {exc}") from exc
    tags = frozenset(
        (el.text or "").strip() for el in root.iter() if _local(el.tag) == "tag" and el.text
    )
    limit = 100.0
    io_limits: dict[str, dict[str, int]] = {}
    for el in root.iter():
        name = _local(el.tag)
        try:
            if name == "vcpu-limit" and el.text:
                limit = float(el.text)
            elif name == "io-limit" and el.get("dev"):
                io_limits[el.get("dev", "")] = {k: int(el.get(k, "0")) for k in IO_KEYS}
        except ValueError as exc:
            raise HypervisorError(f"bad value in loadmaster metadata: {exc}") from exc
    return tags, limit, io_limits


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def disk_targets(desc: ET.Element) -> dict[str, str]:
    """A domain's disks by target (``vda``) and by source file, each to its target."""
    found: dict[str, str] = {}
    for disk in desc.findall("./devices/disk[@device='disk']"):
        target = disk.find("target")
        dev = "" if target is None else target.get("dev", "")
        if not dev:
            continue
        found[dev] = dev
        source = disk.find("source")
        if source is not None and source.get("file"):
            found[source.get("file", "")] = dev
    return found


# -- guest lifecycle: domain XML -----------------------------------------------------------

# Written with the "lm" prefix, as the module docstring shows it.
ET.register_namespace("lm", METADATA_NS)
# How often the guest's balloon driver reports memory stats, set in the domain XML.
LAUNCH_STATS_PERIOD = 2


def is_managed(xml: str | None) -> bool:
    """Whether a ``<lm:vm>`` metadata element carries the ``<lm:managed/>`` marker."""
    if not xml:
        return False
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise HypervisorError(f"malformed loadmaster metadata: {exc}") from exc
    return any(_local(el.tag) == "managed" for el in root.iter())


def with_tags(xml: str | None, tags: frozenset[str]) -> str:
    """The ``<lm:vm>`` element ``xml`` (or a new one) with its tags replaced by ``tags``;
    everything else in it (the managed marker, limits) is kept. Written without namespace,
    as ``setMetadata`` wants it: libvirt puts the element in its namespace itself (and
    refuses one that declares it already)."""
    try:
        root = ET.fromstring(xml) if xml else ET.Element("vm")
    except ET.ParseError as exc:
        raise HypervisorError(f"malformed loadmaster metadata: {exc}") from exc
    for el in root.iter():
        el.tag = _local(el.tag)
    for el in [el for el in root if el.tag == "tag"]:
        root.remove(el)
    for tag in sorted(tags):
        ET.SubElement(root, "tag").text = tag
    return ET.tostring(root, encoding="unicode")


def domain_xml(
    spec: GuestSpec, driver: str, image: GuestImage | None, disk_path: str | None = None
) -> str:
    """The persistent definition of a launched guest. ``driver`` is the connection's
    ``getType()``: the test driver gets the minimal domain it accepts; QEMU a TCG guest
    (nested KVM does not work on the CI machines) booting ``image`` with a stats balloon.
    Both get the guest's disk (the volume at ``disk_path``) and NICs."""
    test = driver.upper() == "TEST"
    if not test and image is None:
        raise HypervisorError(
            f"cannot launch {spec.name} on {driver}: no guest kernel and initrd configured"
        )
    dom = ET.Element("domain", type="test" if test else "qemu")
    ET.SubElement(dom, "name").text = spec.name
    ET.SubElement(dom, "uuid").text = spec.uuid
    ET.SubElement(dom, "memory", unit="KiB").text = str(spec.memory_kib)
    ET.SubElement(dom, "currentMemory", unit="KiB").text = str(spec.memory_kib)
    ET.SubElement(dom, "vcpu").text = str(spec.vcpus)
    _tune_element(dom, "cputune", spec.quota.cpu)
    vm = ET.SubElement(ET.SubElement(dom, "metadata"), f"{{{METADATA_NS}}}vm")
    ET.SubElement(vm, f"{{{METADATA_NS}}}managed")
    if spec.quota.vif:
        ET.SubElement(
            vm, f"{{{METADATA_NS}}}{NIC_LIMIT}", {k: str(v) for k, v in spec.quota.vif.items()}
        )
    for tag in sorted(spec.tags):
        ET.SubElement(vm, f"{{{METADATA_NS}}}tag").text = tag
    os_el = ET.SubElement(dom, "os")
    if test or image is None:
        ET.SubElement(os_el, "type").text = "hvm"
        devices = ET.SubElement(dom, "devices")
        _guest_devices(devices, spec, disk_path)
        if spec.host_devices:
            hostdev_elements(devices, spec.host_devices)
        return ET.tostring(dom, encoding="unicode")
    ET.SubElement(os_el, "type", arch="x86_64", machine="pc").text = "hvm"
    ET.SubElement(os_el, "kernel").text = str(image.kernel)
    ET.SubElement(os_el, "initrd").text = str(image.initrd)
    ET.SubElement(os_el, "cmdline").text = image.cmdline
    # ACPI, so that a graceful shutdown (the power button) reaches the guest.
    ET.SubElement(ET.SubElement(dom, "features"), "acpi")
    for event, action in (("on_poweroff", "destroy"), ("on_reboot", "restart")):
        ET.SubElement(dom, event).text = action
    ET.SubElement(dom, "on_crash").text = "destroy"
    devices = ET.SubElement(dom, "devices")
    _guest_devices(devices, spec, disk_path)
    if image.log_dir is not None:
        serial = ET.SubElement(devices, "serial", type="file")
        # Appended to, not truncated: a restart or a live migration keeps the console's past.
        ET.SubElement(
            serial, "source", path=str(image.log_dir / f"{spec.name}.serial"), append="on"
        )
        ET.SubElement(serial, "target", port="0")
    balloon = ET.SubElement(devices, "memballoon", model="virtio")
    ET.SubElement(balloon, "stats", period=str(LAUNCH_STATS_PERIOD))
    hostdev_elements(devices, spec.host_devices)
    return ET.tostring(dom, encoding="unicode")


def _guest_devices(devices: ET.Element, spec: GuestSpec, disk_path: str | None) -> None:
    if disk_path is not None:
        disk = disk_element(disk_path)
        _tune_element(disk, "iotune", spec.quota.disk)
        devices.append(disk)
    for nic in spec.nics:
        devices.append(interface_element(nic))


def _tune_element(parent: ET.Element, tag: str, limits: Mapping[str, int]) -> None:
    """``<iotune>`` or ``<cputune>``, one child per limit; none without limits."""
    if limits:
        tune = ET.SubElement(parent, tag)
        for name, value in limits.items():
            ET.SubElement(tune, name).text = str(value)


def nic_quota(xml: str | None) -> dict[str, int]:
    """The NIC limits of a ``<lm:vm>`` element (``NET_KEYS``; empty: none)."""
    if not xml:
        return {}
    try:
        root = ET.fromstring(xml)
        found = next((el for el in root.iter() if _local(el.tag) == NIC_LIMIT), None)
        return {} if found is None else {k: int(v) for k, v in found.attrib.items()}
    except (ET.ParseError, ValueError) as exc:
        raise HypervisorError(f"malformed loadmaster metadata: {exc}") from exc


# ------------------------------------------------------------------------------------------


class LibvirtHypervisor:
    """``guest_image`` is how launched QEMU guests boot (not needed on the test driver),
    ``storage`` where their disks and base images are (``storage.StorageConfig``);
    ``migration_uri`` is where the destination QEMU listens for a live migration's data
    (``tcp://ADDRESS``; None: the destination's host name, as libvirt resolves it).
    KSM is written under ``sys_root``; see ``ksm_for`` for the default. ``tap_shaper``
    limits NICs where the kernel cannot take libvirt's limits (``agent/hypervisor/shaping.py``; by
    default one for a QEMU host on this machine, none for the test driver or a remote
    host)."""

    def __init__(
        self,
        uri: str,
        sys_root: Path | None = None,
        *,
        guest_image: GuestImage | None = None,
        migration_uri: str | None = None,
        storage: StorageConfig | None = None,
        tap_shaper: TapShaper | None = None,
    ) -> None:
        self._libvirt = _import_libvirt()
        # libvirt prints every error on stderr by default; they are raised and logged instead.
        self._libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        try:
            self._conn = self._libvirt.open(uri)
        except self._libvirt.libvirtError as exc:
            raise HypervisorError(f"cannot connect to {uri}: {exc}") from exc
        self.uri = uri
        self.ksm = ksm_for(uri, sys_root)
        self._domains: dict[str, Any] = {}
        self._balloon_min: dict[str, int] = {}
        self.guest_image = guest_image
        self.migration_uri = migration_uri
        self.storage = GuestStorage(self._conn, self._libvirt, storage or StorageConfig())
        if tap_shaper is None and not is_test_driver(uri) and not urlsplit(uri).netloc:
            tap_shaper = TapShaper()
        self._tap_shaper = tap_shaper
        # Whether the taps are shaped by tc, decided the first time it matters.
        self._shaping_by_tc: bool | None = None

    @classmethod
    def from_options(cls, options: DriverOptions) -> LibvirtHypervisor:
        """The ``libvirt`` entry of ``loadmaster.hypervisors``."""
        return cls(
            options.uri,
            options.sys_root,
            guest_image=options.guest_image,
            migration_uri=options.migration_uri,
            storage=options.storage,
        )

    def close(self) -> None:
        self._conn.close()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._libvirt.libvirtError as exc:
            raise HypervisorError(f"{what}: {exc}") from exc
        except LookupError as exc:
            # The binding raises LookupError for a parameter name the driver does not offer.
            raise HypervisorError(f"{what}: not supported by this driver ({exc})") from exc

    def _domain(self, uuid: str) -> Any:
        dom = self._domains.get(uuid)
        if dom is None:
            dom = self._call(f"lookup {uuid}", lambda: self._conn.lookupByUUIDString(uuid))
            self._domains[uuid] = dom
        return dom

    def _listed(self, what: str, flag: str) -> list[Any]:
        """``listAllDomains`` with one of libvirt's ``VIR_CONNECT_LIST_DOMAINS_*`` flags."""
        flags = getattr(self._libvirt, f"VIR_CONNECT_LIST_DOMAINS_{flag}")
        return self._call(what, lambda: self._conn.listAllDomains(flags))

    def list_guests(self) -> list[GuestInfo]:
        domains = self._listed("list domains", "ACTIVE")
        guests = []
        seen: dict[str, Any] = {}
        for dom in domains:
            uuid = dom.UUIDString()
            if uuid not in self._domains:
                self._first_seen(uuid, dom)
            try:
                guests.append(self._guest_info(uuid, dom))
            except HypervisorError:
                # Gone since the listing (moved away or removed by a worker, stopped):
                # it does not run, and the other guests are still worth listing.
                if self._active_quietly(dom):
                    raise
                continue
            seen[uuid] = dom
        self._domains = seen
        self._balloon_min = {u: m for u, m in self._balloon_min.items() if u in seen}
        self._sweep_shaping()
        return guests

    def _first_seen(self, uuid: str, dom: Any) -> None:
        """A guest seen running for the first time: what its definition cannot say."""
        self._start_memory_stats(dom)
        try:
            self._apply_nic_quota(uuid, dom)
        except HypervisorError as exc:
            log.warning("the flavor's NIC limits of %s are not applied: %s", uuid, exc)

    def _apply_nic_quota(self, uuid: str, dom: Any) -> None:
        limits = nic_quota(self._metadata(uuid, dom))
        if not limits:
            return
        desc = ET.fromstring(self._call(f"domain XML of {uuid}", lambda: dom.XMLDesc(0)))
        for target in desc.findall("./devices/interface/target"):
            self.set_interface_bandwidth(uuid, target.get("dev", ""), limits)

    def _start_memory_stats(self, dom: Any) -> None:
        # Without a stats period the balloon driver never refreshes "unused" memory.
        try:
            dom.setMemoryStatsPeriod(MEMORY_STATS_PERIOD, self._libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except self._libvirt.libvirtError:
            return

    def _guest_info(self, uuid: str, dom: Any) -> GuestInfo:
        desc = ET.fromstring(self._call("domain XML", lambda: dom.XMLDesc(0)))
        targets = disk_targets(desc)
        disks = tuple(dict.fromkeys(targets.values()))
        min_guarantee = desc.findtext("./memtune/min_guarantee")
        self._balloon_min[uuid] = int(min_guarantee) if min_guarantee else 0
        meta = self._metadata(uuid, dom)
        tags, limit, named_limits = parse_metadata(meta)
        # The IO policy acts on the guest's real disks, by their target: one named by its
        # file is the disk there; one the guest does not have is no disk to limit.
        io_limits = {targets[d]: lim for d, lim in named_limits.items() if d in targets}
        interfaces = tuple(
            t.get("dev", "") for t in desc.findall("./devices/interface/target") if t.get("dev")
        )
        return GuestInfo(
            uuid, dom.name(), tags, limit, disks, io_limits, interfaces, managed=is_managed(meta)
        )

    def _metadata(self, uuid: str, dom: Any, flags: int = 0) -> str | None:
        """The domain's ``<lm:vm>`` element, None when it has none."""
        lv = self._libvirt
        try:
            meta: str = dom.metadata(lv.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, flags)
        except lv.libvirtError as exc:
            if exc.get_error_code() != lv.VIR_ERR_NO_DOMAIN_METADATA:
                raise HypervisorError(f"metadata of {uuid}: {exc}") from exc
            return None
        return meta

    def memory_stats(self, uuid: str) -> Mapping[str, int]:
        dom = self._domain(uuid)
        stats: dict[str, int] = self._call(f"memory stats of {uuid}", dom.memoryStats)
        return stats

    def balloon_info(self, uuid: str) -> BalloonInfo:
        dom = self._domain(uuid)
        info = self._call(f"info of {uuid}", dom.info)
        return BalloonInfo(
            current=int(info[2]), maximum=int(info[1]), minimum=self._balloon_min.get(uuid, 0)
        )

    def set_memory(self, uuid: str, kib: int) -> None:
        dom = self._domain(uuid)
        self._call(f"setMemory {uuid} {kib}", lambda: dom.setMemory(kib))

    def cpu_stats(self, uuid: str) -> CpuStats:
        dom = self._domain(uuid)
        info = self._call(f"info of {uuid}", dom.info)
        return CpuStats(cpu_time_ns=int(info[4]), vcpu_count=int(info[3]))

    def cpu_tune(self, uuid: str) -> CpuTune:
        dom = self._domain(uuid)
        params = self._call(f"scheduler parameters of {uuid}", dom.schedulerParameters)
        return CpuTune(
            quota=params.get("vcpu_quota"),
            period=params.get("vcpu_period"),
            shares=params.get("cpu_shares"),
        )

    def set_cpu_tune(
        self, uuid: str, *, quota: int | None, period: int | None, shares: int | None
    ) -> None:
        params = {
            k: v
            for k, v in (("vcpu_quota", quota), ("vcpu_period", period), ("cpu_shares", shares))
            if v is not None
        }
        if not params:
            return
        dom = self._domain(uuid)
        self._call(f"set CPU tune of {uuid} {params}", lambda: dom.setSchedulerParameters(params))

    def block_stats(self, uuid: str, disk: str) -> BlockStats:
        dom = self._domain(uuid)
        rd_req, rd_bytes, wr_req, wr_bytes, _errors = self._call(
            f"block stats of {uuid} {disk}", lambda: dom.blockStats(disk)
        )
        return BlockStats(int(rd_req), int(rd_bytes), int(wr_req), int(wr_bytes))

    def io_tune(self, uuid: str, disk: str) -> Mapping[str, int]:
        dom = self._domain(uuid)
        tune = self._call(f"IO tune of {uuid} {disk}", lambda: dom.blockIoTune(disk, 0))
        return {k: int(tune.get(k, 0)) for k in IO_KEYS}

    def set_io_tune(self, uuid: str, disk: str, limits: Mapping[str, int]) -> None:
        dom = self._domain(uuid)
        live = self._libvirt.VIR_DOMAIN_AFFECT_LIVE
        self._call(
            f"set IO tune of {uuid} {disk}", lambda: dom.setBlockIoTune(disk, dict(limits), live)
        )

    def stop_guest(self, uuid: str, *, force: bool) -> None:
        dom = self._domain(uuid)
        self._call(
            f"{'destroy' if force else 'shutdown'} {uuid}", dom.destroy if force else dom.shutdown
        )

    def ksm_read(self) -> Mapping[str, int | None]:
        return self.ksm.read()

    def ksm_write(self, key: str, value: int) -> None:
        self.ksm.write(key, value)

    # -- guest lifecycle and host discovery --------------------------------------------

    def host_info(self) -> HostInfo:
        _model, memory_mib, cpus, *_ = self._call("node info", self._conn.getInfo)
        free = int(self._call("free memory", self._conn.getFreeMemory))
        test = self._call("driver type", self._conn.getType).upper() == "TEST"
        if test:
            # The test driver answers in KiB where the API says bytes: read as bytes, its
            # host would have 3 MiB free and refuse every launch (the host's final say).
            free *= 1024
        caps = ET.fromstring(self._call("capabilities", self._conn.getCapabilities))
        cells = tuple(
            NumaCell(
                id=int(cell.get("id", "0")),
                cpus=len(cell.findall("./cpus/cpu")),
                memory_kib=int(cell.findtext("memory") or 0),
            )
            for cell in caps.findall("./host/topology/cells/cell")
        )
        if test and not cells:
            # A test host read from a file (a node-device fixture) has no NUMA cells to
            # count free memory in, and says none is free: it is made up, all of it is.
            free = int(memory_mib) * 1024 * 1024
        # A shared pool's DISK_GB is its sharing provider's, counted once for the hosts
        # that mount it, not once per host.
        capacity, shared = self._disk_gb(), self.storage.config.shared
        return HostInfo(
            hostname=self._call("host name", self._conn.getHostname),
            cpus=int(cpus),
            memory_kib=int(memory_mib) * 1024,
            free_memory_kib=free // 1024,
            numa_cells=cells,
            disk_gb=None if shared else capacity,
            shared_pool=SharedPool(shared, capacity) if shared and capacity else None,
        )

    def _disk_gb(self) -> int | None:
        """The storage pool's size; None, with a warning, when the pool cannot be had: the
        host still runs VMs without a disk, and DISK_GB is not offered."""
        try:
            return self.storage.capacity_gb()
        except HypervisorError as exc:
            log.warning("no DISK_GB: %s", exc)
            return None

    def _lookup(self, uuid: str) -> Any | None:
        """The domain with this UUID, running or not; None when there is none."""
        lv = self._libvirt
        try:
            return self._conn.lookupByUUIDString(uuid)
        except lv.libvirtError as exc:
            if exc.get_error_code() == lv.VIR_ERR_NO_DOMAIN:
                return None
            raise HypervisorError(f"lookup {uuid}: {exc}") from exc

    def _forget(self, uuid: str) -> None:
        self._domains.pop(uuid, None)
        self._balloon_min.pop(uuid, None)

    def launch_guest(self, spec: GuestSpec) -> None:
        what = f"launch {spec.name} ({spec.uuid})"
        dom = self._lookup(spec.uuid)
        if dom is not None:
            if not self._call(f"{what}: state", dom.isActive):
                self._start(dom, what, defined_now=False)
                self._started(spec.uuid, dom)
            return
        driver = self._call("driver type", self._conn.getType)
        # Checked before anything is made: a refusal leaves nothing to clean up.
        try:
            require_networks(self._conn, self._libvirt, (n.network for n in spec.nics))
            kept = None if spec.disk is None else self.storage.kept_disk(spec.uuid)
            disk_path = kept
            if spec.disk is not None and kept is None:
                disk_path = self.storage.make_disk(spec.uuid, spec.disk)
        except HypervisorError as exc:
            raise HypervisorError(f"{what}: {exc}") from exc
        try:
            xml = domain_xml(spec, driver, self.guest_image, disk_path)
            dom = self._call(f"{what}: define", lambda: self._conn.defineXML(xml))
            self._start(dom, what, defined_now=True)
        except HypervisorError:
            if spec.disk is not None and kept is None and self._lookup(spec.uuid) is None:
                # No volume outlives a launch that failed (a concurrent one may use it);
                # a disk the guest had before is its data, kept.
                self.storage.remove_disk(spec.uuid)
            raise
        self._started(spec.uuid, dom)

    def _started(self, uuid: str, dom: Any) -> None:
        self._first_seen(uuid, dom)
        self._domains[uuid] = dom

    def _start(self, dom: Any, what: str, *, defined_now: bool) -> None:
        try:
            dom.create()
        except self._libvirt.libvirtError as exc:
            if self._active_quietly(dom):
                return  # a concurrent launch of the same guest started it first
            if defined_now:
                # Nothing half done: a retry defines it afresh, and no stopped husk remains.
                self._undefine_quietly(dom)
            raise HypervisorError(f"{what}: start: {exc}") from exc

    def _active_quietly(self, dom: Any) -> bool:
        try:
            return bool(dom.isActive())
        except self._libvirt.libvirtError:
            return False

    def _undefine_quietly(self, dom: Any) -> None:
        # The error that led here is the one worth reporting.
        with contextlib.suppress(self._libvirt.libvirtError):
            dom.undefine()

    def stopped_guests(self) -> list[str]:
        domains = self._listed("list stopped domains", "INACTIVE")
        found = []
        for dom in domains:
            uuid = dom.UUIDString()
            try:
                if is_managed(self._metadata(uuid, dom)):
                    found.append(uuid)
            except HypervisorError:
                continue  # undefined since the listing
        return found

    def remove_guest(self, uuid: str, *, keep_disk: bool = False) -> None:
        lv = self._libvirt
        dom = self._lookup(uuid)
        if dom is None:
            return
        self._forget(uuid)
        # Asked before destroying: a transient domain is gone once destroyed.
        persistent = self._call(f"remove {uuid}: persistence", dom.isPersistent)
        self._destroy(dom, f"remove {uuid}: destroy")
        if persistent:
            try:
                dom.undefine()
            except lv.libvirtError as exc:
                if exc.get_error_code() != lv.VIR_ERR_NO_DOMAIN:
                    raise HypervisorError(f"remove {uuid}: undefine: {exc}") from exc
        if not (keep_disk and self.storage.config.shared):
            self.storage.remove_disk(uuid)
        self._sweep_shaping()

    def set_tags(self, uuid: str, tags: frozenset[str]) -> None:
        lv = self._libvirt
        dom = self._lookup(uuid)
        if dom is None:
            raise HypervisorError(f"set tags of {uuid}: no such guest")
        active = self._call(f"set tags of {uuid}: state", dom.isActive)
        persistent = self._call(f"set tags of {uuid}: persistence", dom.isPersistent)
        # The live and the persistent definitions can differ (other facts in the element):
        # each keeps its own, with the new tags.
        targets = [lv.VIR_DOMAIN_AFFECT_LIVE] if active else []
        if persistent:
            targets.append(lv.VIR_DOMAIN_AFFECT_CONFIG)
        for flags in targets:
            xml = with_tags(self._metadata(uuid, dom, flags), tags)
            try:
                dom.setMetadata(lv.VIR_DOMAIN_METADATA_ELEMENT, xml, "lm", METADATA_NS, flags)
            except lv.libvirtError as exc:
                raise HypervisorError(f"set tags of {uuid} to {sorted(tags)}: {exc}") from exc

    def set_host_devices(self, uuid: str, devices: Sequence[HostDevice]) -> None:
        lv = self._libvirt
        what = f"set the host devices of {uuid}"
        dom = self._lookup(uuid)
        if dom is None:
            raise HypervisorError(f"{what}: no such guest")
        flags = lv.VIR_DOMAIN_AFFECT_LIVE
        if self._call(f"{what}: persistence", dom.isPersistent):
            flags |= lv.VIR_DOMAIN_AFFECT_CONFIG
        held = given_aliases(self._call(f"{what}: definition", lambda: dom.XMLDesc(0)))
        wanted = {d.alias: d for d in devices}
        try:
            for alias in sorted(held - set(wanted)):
                dom.detachDeviceAlias(alias, flags)
            for alias, device in wanted.items():
                if alias not in held:
                    dom.attachDeviceFlags(
                        ET.tostring(hostdev_element(device), encoding="unicode"), flags
                    )
        except lv.libvirtError as exc:
            raise HypervisorError(f"{what}: {exc}") from exc

    def migrate_guest(self, uuid: str, destination_uri: str) -> None:
        lv = self._libvirt
        what = f"migrate {uuid} to {destination_uri}"
        dom = self._lookup(uuid)
        if dom is None or not self._call(f"{what}: state", dom.isActive):
            raise HypervisorError(f"{what}: no running guest {uuid} here")
        try:
            dest = lv.open(destination_uri)
        except lv.libvirtError as exc:
            raise HypervisorError(f"{what}: cannot connect to the destination: {exc}") from exc
        shared = self.storage.config.shared
        copied = False
        try:
            try:
                copied = self._migrate_live(dom, dest)
            except lv.libvirtError as exc:
                if exc.get_error_code() != lv.VIR_ERR_NO_SUPPORT:
                    self._resume_after_failed_migration(dom, what)
                    if not shared:
                        # On a shared pool the volume there is the one this guest runs on.
                        self._drop_copy_there(dest, uuid, what)
                    raise HypervisorError(f"{what}: live migration failed: {exc}") from exc
                # The driver cannot migrate (the test driver): a cold move instead.
                self._move_cold(dom, dest, what)
            if shared:
                self._refresh_there(dest, what)
        finally:
            # The guest's fate is decided; a failed close changes nothing.
            with contextlib.suppress(lv.libvirtError):
                dest.close()
        self._forget(uuid)
        if copied:
            try:
                self.storage.remove_disk(uuid)
            except HypervisorError as exc:
                # The guest runs there: the move succeeded whatever becomes of this copy.
                log.warning("%s: the disk left here could not be deleted: %s", what, exc)

    def _migrate_live(self, dom: Any, dest: Any) -> bool:
        """Returns whether the guest's disk was copied to the destination's pool (libvirt
        makes the volume there, a flattened copy); the copy here is then stale. On a shared
        pool nothing is copied: the destination opens the same file."""
        lv = self._libvirt
        # Persistent on the destination, undefined here: the guest moves, definition and all.
        flags = lv.VIR_MIGRATE_LIVE | lv.VIR_MIGRATE_PERSIST_DEST
        if dom.isPersistent():
            flags |= lv.VIR_MIGRATE_UNDEFINE_SOURCE
        params: dict[str, Any] = {}
        if self.migration_uri:
            params[lv.VIR_MIGRATE_PARAM_URI] = self.migration_uri
        disks = self._pool_disks(dom)
        if disks and self.storage.config.shared:
            # libvirt recognises shared storage only by its filesystem type (NFS, GFS2,
            # OCFS2, CephFS, ...) and refuses any other file disk as "Unsafe migration",
            # whatever its cache mode. The operator declared the pool one storage on every
            # host; QEMU flushes the disk at the switch-over and the destination drops its
            # page cache of it, so the one file stays consistent.
            flags |= lv.VIR_MIGRATE_UNSAFE
            disks = []
        elif disks:
            flags |= lv.VIR_MIGRATE_NON_SHARED_DISK
            params[lv.VIR_MIGRATE_PARAM_MIGRATE_DISKS] = disks
        dom.migrate3(dest, params, flags)
        return bool(disks)

    def _refresh_there(self, dest: Any, what: str) -> None:
        """The destination's pool lists the volume the guest brought, so that its agent
        deletes it with the guest."""
        try:
            GuestStorage(dest, self._libvirt, StorageConfig()).refresh()
        except HypervisorError as exc:
            # The guest runs there: the move succeeded (an agent of a shared pool looks
            # for a volume again before it gives up on deleting it).
            log.warning("%s: the destination's pool was not refreshed: %s", what, exc)

    def _drop_copy_there(self, dest: Any, uuid: str, what: str) -> None:
        """libvirt leaves the disk it made on the destination for a migration that failed:
        deleted, unless a guest of this uuid is there (then it is not this move's)."""
        lv = self._libvirt
        try:
            dest.lookupByUUIDString(uuid)
            return
        except lv.libvirtError:
            pass
        try:
            GuestStorage(dest, lv, StorageConfig()).remove_disk(uuid)
        except HypervisorError as exc:
            # The error that led here is the one worth reporting.
            log.warning("%s: the disk copy left on the destination stays: %s", what, exc)

    def _pool_disks(self, dom: Any) -> list[str]:
        """The target devices of the guest's disks that are its volume in the pool."""
        desc = ET.fromstring(dom.XMLDesc(0))
        name = volume_name(dom.UUIDString())
        found = []
        for disk in desc.findall("./devices/disk[@device='disk']"):
            source, target = disk.find("source"), disk.find("target")
            if source is None or target is None:
                continue
            if Path(source.get("file", "")).name == name:
                found.append(target.get("dev", ""))
        return found

    def _resume_after_failed_migration(self, dom: Any, what: str) -> None:
        """libvirt rolls a failed migration back, but a guest can be left paused (failure
        after the switch-over started): it must run here again."""
        lv = self._libvirt
        try:
            state, _reason = dom.state()
            if state == lv.VIR_DOMAIN_PAUSED:
                dom.resume()
            elif state != lv.VIR_DOMAIN_RUNNING:
                raise HypervisorError(f"{what}: failed, and the guest is not running here")
        except lv.libvirtError as exc:
            raise HypervisorError(
                f"{what}: failed, and the guest cannot be resumed here: {exc}"
            ) from exc

    def _move_cold(self, dom: Any, dest: Any, what: str) -> None:
        """Define and start on the destination, then destroy and undefine here. On any
        failure what this defined on the destination goes, and the guest keeps running
        here."""
        lv = self._libvirt
        uuid = dom.UUIDString()
        xml = self._call(f"{what}: definition", lambda: dom.XMLDesc(lv.VIR_DOMAIN_XML_INACTIVE))
        persistent = self._call(f"{what}: persistence", dom.isPersistent)
        try:
            there = dest.lookupByUUIDString(uuid)
        except lv.libvirtError:
            there = None
        if there is not None and there.isActive():
            if there.name() == dom.name() and is_managed(self._metadata(uuid, there)):
                # This very guest, started there by a move whose agent was killed before
                # stopping it here: the move is finished, not undone.
                self._stop_after_move(dom, persistent, what)
                return
            # Never touched: whatever runs there under this UUID is not this move's to undo.
            raise HypervisorError(f"{what}: cold move, the guest already runs on the destination")
        try:
            moved = dest.defineXML(xml)
        except lv.libvirtError as exc:
            raise HypervisorError(f"{what}: cold move, define on the destination: {exc}") from exc
        try:
            moved.create()
            dom.destroy()
        except lv.libvirtError as exc:
            self._undo_on_destination(moved)
            raise HypervisorError(f"{what}: cold move: {exc}") from exc
        if persistent:
            # The guest runs there; a definition left here is only a stale record.
            self._undefine_quietly(dom)

    def _destroy(self, dom: Any, what: str) -> None:
        """Power the domain off; already off (or stopped since it was looked up) is what
        was wanted, not an error."""
        lv = self._libvirt
        try:
            dom.destroy()
        except lv.libvirtError as exc:
            if exc.get_error_code() not in (lv.VIR_ERR_OPERATION_INVALID, lv.VIR_ERR_NO_DOMAIN):
                raise HypervisorError(f"{what}: {exc}") from exc

    def _stop_after_move(self, dom: Any, persistent: bool, what: str) -> None:
        self._destroy(dom, f"{what}: cold move, stop here")
        if persistent:
            self._undefine_quietly(dom)

    def _undo_on_destination(self, moved: Any) -> None:
        # The error that led here is the one worth reporting.
        with contextlib.suppress(self._libvirt.libvirtError):
            if moved.isActive():
                moved.destroy()
        self._undefine_quietly(moved)

    # -- network bandwidth and NUMA memory tuning ----------------------------------------

    def interface_bandwidth(self, uuid: str, interface: str) -> Mapping[str, int]:
        dom = self._domain(uuid)
        what = f"interface parameters of {uuid} {interface}"
        shaper = self._shaper()
        if shaper is not None:
            self._require_interface(dom, interface, what)
            return self._shaped(what, lambda: shaper.bandwidth(interface))
        params = self._call(what, lambda: dom.interfaceParameters(interface, 0))
        return {k: int(params.get(k, 0)) for k in NET_KEYS}

    def set_interface_bandwidth(self, uuid: str, interface: str, limits: Mapping[str, int]) -> None:
        dom = self._domain(uuid)
        what = f"set interface parameters of {uuid} {interface} {dict(limits)}"
        shaper = self._shaper()
        if shaper is not None:
            unknown = sorted(set(limits) - set(NET_KEYS))
            if unknown:
                raise HypervisorError(f"{what}: unknown parameters {unknown}")
            self._require_interface(dom, interface, what)
            self._shaped(what, lambda: shaper.set_bandwidth(interface, limits))
            return
        live = self._libvirt.VIR_DOMAIN_AFFECT_LIVE
        self._call(what, lambda: dom.setInterfaceParameters(interface, dict(limits), live))

    def _shaper(self) -> TapShaper | None:
        """The tap shaper when this host's kernel cannot take libvirt's limits; None when
        libvirt sets them. Probed once (``libvirt_can_shape``)."""
        if self._tap_shaper is None:
            return None
        if self._shaping_by_tc is None:
            self._shaping_by_tc = not libvirt_can_shape(self._tap_shaper.runner)
        return self._tap_shaper if self._shaping_by_tc else None

    def _shaped(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except ShapingError as exc:
            raise HypervisorError(f"{what}: {exc}") from exc

    def _require_interface(self, dom: Any, interface: str, what: str) -> None:
        """tc reaches any device of the host: only the guest's own NICs are its to shape."""
        desc = ET.fromstring(self._call(f"{what}: domain XML", lambda: dom.XMLDesc(0)))
        own = [t.get("dev") for t in desc.findall("./devices/interface/target")]
        if interface not in own:
            raise HypervisorError(f"{what}: the guest has no interface {interface!r}")

    def _sweep_shaping(self) -> None:
        """The ifb devices of taps that are gone (their guests stopped, moved or removed)."""
        if self._shaping_by_tc and self._tap_shaper is not None:
            try:
                self._tap_shaper.sweep()
            except ShapingError as exc:
                log.warning("shaping of a gone interface stays: %s", exc)

    def numa_tune(self, uuid: str) -> NumaTune:
        dom = self._domain(uuid)
        params = self._call(f"NUMA parameters of {uuid}", lambda: dom.numaParameters(0))
        mode = int(params.get("numa_mode", 0))
        if not 0 <= mode < len(NUMA_MODES):
            raise HypervisorError(f"NUMA parameters of {uuid}: unknown mode {mode}")
        return NumaTune(NUMA_MODES[mode], str(params.get("numa_nodeset", "")))

    def set_numa_tune(self, uuid: str, *, mode: str | None, nodeset: str | None) -> None:
        params: dict[str, Any] = {}
        if mode is not None:
            if mode not in NUMA_MODES:
                raise HypervisorError(f"unknown NUMA mode {mode!r}")
            params["numa_mode"] = NUMA_MODES.index(mode)
        if nodeset is not None:
            params["numa_nodeset"] = nodeset
        if not params:
            return
        dom = self._domain(uuid)
        live = self._libvirt.VIR_DOMAIN_AFFECT_LIVE
        self._call(
            f"set NUMA parameters of {uuid} {params}",
            lambda: dom.setNumaParameters(params, live),
        )
