"""A flavor's quota (``loadmaster.quota``) on libvirt's test driver: the disk's
``<iotune>`` and the domain's ``<cputune>`` in the definition, the NIC limits applied once
the guest runs and read back, all of them kept by a move to another host (the NIC limits
applied there again), and the work item's quota reaching the launched guest. The tc path
of the NIC limits is in test_agent_shaping.py, the real-QEMU check in
tests/realvm/test_real_tuning.py.
"""

from __future__ import annotations

import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import NODE_XML

from loadmaster.agent.hypervisor.base import NET_KEYS, DiskSpec, GuestSpec, NicSpec
from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor
from loadmaster.agent.hypervisor.storage import StorageConfig
from loadmaster.agent.manager.host_manager import guest_spec
from loadmaster.quota import VIF_KEYS, flavor_quota

MIB = 1024 * 1024
MAC = "52:54:00:12:34:57"
SPECS = {
    "quota:disk_total_bytes_sec": str(MIB),
    "quota:disk_total_bytes_sec_max": str(2 * MIB),
    "quota:disk_read_iops_sec": "300",
    "quota:disk_write_iops_sec": "0",  # no limit: left out
    "quota:vif_inbound_average": "256",
    "quota:vif_inbound_burst": "64",
    "quota:vif_outbound_average": "128",
    "quota:vif_outbound_peak": "512",
    "quota:cpu_shares": "512",
    "quota:cpu_period": "100000",
    "quota:cpu_quota": "50000",
}
NIC_LIMITS = {
    "inbound.average": 256,
    "inbound.peak": 0,
    "inbound.burst": 64,
    "outbound.average": 128,
    "outbound.peak": 512,
    "outbound.burst": 0,
}


def spec() -> GuestSpec:
    uuid = str(uuidlib.uuid4())
    return GuestSpec(
        uuid,
        f"lm-{uuid[:8]}",
        256 * 1024,
        1,
        disk=DiskSpec(None, 1024 * MIB),
        nics=(NicSpec("default", MAC),),
        quota=flavor_quota(SPECS),
    )


@pytest.fixture
def source(tmp_path: Path) -> Iterator[LibvirtHypervisor]:
    """A private test host with a ``default`` network, so a move has another host to go to
    (the shared ``test:///default``)."""
    hv = LibvirtHypervisor(f"test://{NODE_XML}", storage=StorageConfig(pool_dir=tmp_path / "pool"))
    hv._conn.networkCreateXML(
        "<network><name>default</name><bridge name='lmq0'/>"
        "<ip address='192.168.150.1' netmask='255.255.255.0'/></network>"
    )
    yield hv
    hv.close()


def iotune(hv: LibvirtHypervisor, uuid: str) -> dict[str, int]:
    tune = hv._domain(uuid).blockIoTune("vda", 0)
    return {k: int(v) for k, v in tune.items() if k != "group_name" and int(v)}


def cputune(hv: LibvirtHypervisor, uuid: str) -> dict[str, str]:
    desc = ET.fromstring(hv._domain(uuid).XMLDesc(0))
    return {el.tag: el.text or "" for el in desc.findall("./cputune/*")}


def interface(hv: LibvirtHypervisor, uuid: str) -> str:
    [guest] = [g for g in hv.list_guests() if g.uuid == uuid]
    [nic] = guest.interfaces
    return nic


def test_launch_applies_the_flavors_quota_and_a_move_keeps_it(
    source: LibvirtHypervisor, default_hv: LibvirtHypervisor
) -> None:
    s = spec()
    source.launch_guest(s)
    want_io = {"total_bytes_sec": MIB, "total_bytes_sec_max": 2 * MIB, "read_iops_sec": 300}
    assert iotune(source, s.uuid) == want_io
    assert cputune(source, s.uuid) == {"shares": "512", "period": "100000", "quota": "50000"}
    # Applied as soon as it runs, not left for a later look at the guests.
    nic = ET.fromstring(source._domain(s.uuid).XMLDesc(0)).find("./devices/interface/target")
    assert nic is not None
    assert source.interface_bandwidth(s.uuid, nic.get("dev", "")) == NIC_LIMITS

    # As on shared storage: the test driver refuses the parameters of a disk copy.
    source._pool_disks = lambda _dom: []  # type: ignore[method-assign]
    source.migrate_guest(s.uuid, "test:///default")
    # The destination's agent applies the NIC limits when it first sees the guest run;
    # the disk's and the CPU's came in its definition.
    there = interface(default_hv, s.uuid)
    assert default_hv.interface_bandwidth(s.uuid, there) == NIC_LIMITS
    assert iotune(default_hv, s.uuid) == want_io
    assert cputune(default_hv, s.uuid) == {"shares": "512", "period": "100000", "quota": "50000"}


def test_a_guest_without_quota_has_no_limits(source: LibvirtHypervisor) -> None:
    s = spec()
    plain = GuestSpec(s.uuid, s.name, s.memory_kib, s.vcpus, disk=s.disk, nics=s.nics)
    source.launch_guest(plain)
    desc = ET.fromstring(source._domain(s.uuid).XMLDesc(0))
    assert desc.find("./cputune") is None and desc.find("./devices/disk/iotune") is None
    assert source.interface_bandwidth(s.uuid, interface(source, s.uuid)) == dict.fromkeys(
        NET_KEYS, 0
    )


def test_the_nic_quota_has_the_hypervisors_limit_names() -> None:
    assert VIF_KEYS == NET_KEYS


def test_the_work_items_quota_reaches_the_guest_spec() -> None:
    item = {
        "vm": "6F2C1D9E-3B7A-4C55-9A0E-1D2B3C4D5E6F",
        "name": "q",
        "memory_mb": 256,
        "vcpus": 1,
        "quota": flavor_quota(SPECS).to_dict(),
    }
    assert guest_spec(item).quota == flavor_quota(SPECS)
    assert not guest_spec({**item, "quota": None}).quota.disk
