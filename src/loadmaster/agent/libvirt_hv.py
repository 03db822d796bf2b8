"""The hypervisor interface over the libvirt Python binding.

VM tags and policy facts live in the domain's metadata, in loadmaster's namespace::

    <metadata>
      <lm:vm xmlns:lm="https://loadmaster.dev/xmlns/vm/1">
        <lm:tag>gold</lm:tag>
        <lm:vcpu-limit>50</lm:vcpu-limit>
        <lm:io-limit dev="vda" total_bytes_sec="52428800" total_iops_sec="2000"/>
      </lm:vm>
    </metadata>

KSM is not a libvirt feature: it is read and written in sysfs under ``sys_root``, or, for
the test driver without a ``sys_root``, in memory (``ksm_for``): a test driver host is
made up, and must never change the KSM of the machine the agent runs on.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from loadmaster.agent.hypervisor import (
    IO_KEYS,
    NET_KEYS,
    NUMA_MODES,
    BalloonInfo,
    BlockStats,
    CpuStats,
    CpuTune,
    GuestInfo,
    HypervisorError,
    NumaTune,
    ksm_for,
)

METADATA_NS = "https://loadmaster.dev/xmlns/vm/1"
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


class LibvirtHypervisor:
    def __init__(self, uri: str, sys_root: Path | None = None) -> None:
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

    def list_guests(self) -> list[GuestInfo]:
        lv = self._libvirt
        domains = self._call(
            "list domains",
            lambda: self._conn.listAllDomains(lv.VIR_CONNECT_LIST_DOMAINS_ACTIVE),
        )
        guests = []
        seen: dict[str, Any] = {}
        for dom in domains:
            uuid = dom.UUIDString()
            seen[uuid] = dom
            if uuid not in self._domains:
                self._start_memory_stats(dom)
            guests.append(self._guest_info(uuid, dom))
        self._domains = seen
        self._balloon_min = {u: m for u, m in self._balloon_min.items() if u in seen}
        return guests

    def _start_memory_stats(self, dom: Any) -> None:
        # Without a stats period the balloon driver never refreshes "unused" memory.
        try:
            dom.setMemoryStatsPeriod(MEMORY_STATS_PERIOD, self._libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except self._libvirt.libvirtError:
            return

    def _guest_info(self, uuid: str, dom: Any) -> GuestInfo:
        lv = self._libvirt
        desc = ET.fromstring(self._call("domain XML", lambda: dom.XMLDesc(0)))
        disks = tuple(
            t.get("dev", "")
            for t in desc.findall("./devices/disk[@device='disk']/target")
            if t.get("dev")
        )
        min_guarantee = desc.findtext("./memtune/min_guarantee")
        self._balloon_min[uuid] = int(min_guarantee) if min_guarantee else 0
        try:
            meta = dom.metadata(lv.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0)
        except lv.libvirtError as exc:
            if exc.get_error_code() != lv.VIR_ERR_NO_DOMAIN_METADATA:
                raise HypervisorError(f"metadata of {uuid}: {exc}") from exc
            meta = None
        tags, limit, io_limits = parse_metadata(meta)
        interfaces = tuple(
            t.get("dev", "") for t in desc.findall("./devices/interface/target") if t.get("dev")
        )
        return GuestInfo(uuid, dom.name(), tags, limit, disks, io_limits, interfaces)

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

    # -- network bandwidth and NUMA memory tuning ----------------------------------------

    def interface_bandwidth(self, uuid: str, interface: str) -> Mapping[str, int]:
        dom = self._domain(uuid)
        params = self._call(
            f"interface parameters of {uuid} {interface}",
            lambda: dom.interfaceParameters(interface, 0),
        )
        return {k: int(params.get(k, 0)) for k in NET_KEYS}

    def set_interface_bandwidth(self, uuid: str, interface: str, limits: Mapping[str, int]) -> None:
        dom = self._domain(uuid)
        live = self._libvirt.VIR_DOMAIN_AFFECT_LIVE
        self._call(
            f"set interface parameters of {uuid} {interface} {dict(limits)}",
            lambda: dom.setInterfaceParameters(interface, dict(limits), live),
        )

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
