"""Guests' disks and NICs on libvirt's test driver and on the simulator: the storage pool,
each guest's overlay of its image sized to its disk, its virtio NIC on a network of the
host with the ledger's MAC, and what a refused or failed launch leaves behind (nothing).
The real-QEMU versions are in tests/realvm/test_real_disks.py.

Every ``test:///default`` connection of a process shares one host, so each test names its
own guests and images.
"""

from __future__ import annotations

import struct
import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadmaster.agent.hypervisor import DiskSpec, GuestSpec, HypervisorError, NicSpec
from loadmaster.agent.hypervisor.base import SharedPool
from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor
from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.hypervisor.storage import StorageConfig, base_name
from loadmaster.agent.manager import ManagerConfig
from loadmaster.agent.manager.host_manager import discover
from loadmaster.images import POOL_NAME, volume_name

MAC = "52:54:00:12:34:56"


def qcow2_file(path: Path, virtual_bytes: int) -> Path:
    """A file with a qcow2 header saying ``virtual_bytes`` (all the agent reads of it)."""
    header = b"QFI\xfb" + struct.pack(">I", 3) + bytes(16) + struct.pack(">Q", virtual_bytes)
    path.write_bytes(header + bytes(512))
    return path


@pytest.fixture
def images(tmp_path: Path) -> Path:
    directory = tmp_path / "images"
    directory.mkdir()
    return directory


@pytest.fixture
def hv(images: Path, tmp_path: Path) -> Iterator[LibvirtHypervisor]:
    h = LibvirtHypervisor(
        "test:///default", storage=StorageConfig(pool_dir=tmp_path / "pool", image_dir=images)
    )
    yield h
    h.close()


def spec(disk: DiskSpec | None, nics: tuple[NicSpec, ...] = ()) -> GuestSpec:
    uuid = str(uuidlib.uuid4())
    return GuestSpec(uuid, f"lm-{uuid[:8]}", 256 * 1024, 1, disk=disk, nics=nics)


def image_name() -> str:
    return f"img-{uuidlib.uuid4().hex[:8]}"


def volumes(hv: LibvirtHypervisor) -> set[str]:
    return set(hv.storage.pool().listVolumes())


def defined(hv: LibvirtHypervisor, uuid: str) -> bool:
    return hv._lookup(uuid) is not None


def test_launch_from_image_makes_overlay_disk_and_nic_and_remove_deletes_it(
    hv: LibvirtHypervisor, images: Path
) -> None:
    image = image_name()
    qcow2_file(images / f"{image}.qcow2", 32 * 1024 * 1024)
    s = spec(DiskSpec(image, 2 * GIB * 1024), (NicSpec("default", MAC),))
    hv.launch_guest(s)

    pool = hv.storage.pool()
    vol = pool.storageVolLookupByName(volume_name(s.uuid))
    assert vol.info()[1] == 2 * GIB * 1024  # sized to DISK_GB, not to the image
    backing = ET.fromstring(vol.XMLDesc(0)).findtext("./backingStore/path")
    assert backing == pool.storageVolLookupByName(base_name(image)).path()
    desc = ET.fromstring(hv._domain(s.uuid).XMLDesc(0))
    disk = desc.find("./devices/disk[@device='disk']")
    assert disk is not None
    assert disk.find("source").get("file") == vol.path()  # type: ignore[union-attr]
    assert disk.find("target").attrib == {"dev": "vda", "bus": "virtio"}  # type: ignore[union-attr]
    nic = desc.find("./devices/interface[@type='network']")
    assert nic is not None
    assert nic.find("mac").get("address") == MAC  # type: ignore[union-attr]
    assert nic.find("source").get("network") == "default"  # type: ignore[union-attr]
    assert nic.find("model").get("type") == "virtio"  # type: ignore[union-attr]

    hv.remove_guest(s.uuid)
    assert volume_name(s.uuid) not in volumes(hv)
    assert base_name(image) in volumes(hv)  # the base stays for the next guest of it


def test_second_guest_of_an_image_reuses_its_base(hv: LibvirtHypervisor, images: Path) -> None:
    image = image_name()
    source = qcow2_file(images / f"{image}.qcow2", 1024 * 1024)
    first, second = spec(DiskSpec(image, GIB * 1024)), spec(DiskSpec(image, GIB * 1024))
    hv.launch_guest(first)
    source.unlink()  # the pool has it now
    hv.launch_guest(second)
    assert {volume_name(first.uuid), volume_name(second.uuid)} <= volumes(hv)
    for s in (first, second):
        hv.remove_guest(s.uuid)


def test_blank_disk_when_no_image(hv: LibvirtHypervisor) -> None:
    s = spec(DiskSpec(None, 3 * GIB * 1024))
    hv.launch_guest(s)
    vol = hv.storage.pool().storageVolLookupByName(volume_name(s.uuid))
    assert vol.info()[1] == 3 * GIB * 1024
    assert ET.fromstring(vol.XMLDesc(0)).find("./backingStore/path") is None
    hv.remove_guest(s.uuid)
    assert volume_name(s.uuid) not in volumes(hv)


def test_missing_image_refused_naming_it_nothing_left(hv: LibvirtHypervisor) -> None:
    image = image_name()
    s = spec(DiskSpec(image, GIB * 1024))
    with pytest.raises(
        HypervisorError, match=rf"image '{image}' is not on this host.*no .*{image}"
    ):
        hv.launch_guest(s)
    assert not defined(hv, s.uuid)
    assert volume_name(s.uuid) not in volumes(hv)


def test_unknown_network_refused_naming_it_nothing_left(
    hv: LibvirtHypervisor, images: Path
) -> None:
    image = image_name()
    qcow2_file(images / f"{image}.qcow2", 1024 * 1024)
    s = spec(DiskSpec(image, GIB * 1024), (NicSpec("nowhere", MAC),))
    with pytest.raises(
        HypervisorError, match=r"network 'nowhere' is not defined on this host \(defined: default"
    ):
        hv.launch_guest(s)
    assert not defined(hv, s.uuid)
    assert volume_name(s.uuid) not in volumes(hv)


def test_image_larger_than_disk_refused_nothing_left(hv: LibvirtHypervisor, images: Path) -> None:
    image = image_name()
    qcow2_file(images / f"{image}.qcow2", 2 * GIB * 1024)
    s = spec(DiskSpec(image, GIB * 1024))
    with pytest.raises(
        HypervisorError, match=rf"image '{image}' is {2 * GIB * 1024} bytes, larger"
    ):
        hv.launch_guest(s)
    assert not defined(hv, s.uuid)
    assert volume_name(s.uuid) not in volumes(hv)


def test_launch_failing_after_the_disk_was_made_removes_it(hv: LibvirtHypervisor) -> None:
    s = spec(DiskSpec(None, GIB * 1024))
    # Another domain of the same name: the define fails once the disk exists.
    clash = spec(None)
    hv.launch_guest(GuestSpec(clash.uuid, s.name, clash.memory_kib, 1))
    with pytest.raises(HypervisorError, match="define"):
        hv.launch_guest(s)
    assert not defined(hv, s.uuid)
    assert volume_name(s.uuid) not in volumes(hv)
    hv.remove_guest(clash.uuid)


def test_host_disk_is_the_pool_capacity(hv: LibvirtHypervisor) -> None:
    capacity = hv.storage.pool().info()[1]
    assert hv.host_info().disk_gb == capacity // (GIB * 1024) > 0
    assert hv.storage.pool().name() == POOL_NAME


# -- the simulator ------------------------------------------------------------------------


def test_sim_keeps_disk_and_nics_and_refuses_unknown_network_and_image() -> None:
    hv = SimulatedHypervisor([], host_memory_kib=8 * GIB, networks=("lan",), images=("deb",))
    good = spec(DiskSpec("deb", GIB * 1024), (NicSpec("lan", MAC),))
    hv.launch_guest(good)
    assert hv.disks() == {good.uuid: good.disk}
    no_net = spec(None, (NicSpec("default", MAC),))
    with pytest.raises(HypervisorError, match=r"network 'default' is not defined.*defined: lan"):
        hv.launch_guest(no_net)
    no_image = spec(DiskSpec("arch", GIB * 1024))
    with pytest.raises(HypervisorError, match="image 'arch' is not on this host"):
        hv.launch_guest(no_image)
    assert {g.uuid for g in hv.list_guests()} == {good.uuid}
    hv.remove_guest(good.uuid)
    assert hv.disks() == {}


def test_a_host_on_a_shared_pool_offers_its_disk_gb_as_the_pools(tmp_path: Path) -> None:
    shared = StorageConfig(pool_dir=tmp_path / "shared", shared="nfs-a")
    hv = LibvirtHypervisor("test:///default", storage=shared)
    try:
        info = hv.host_info()
        capacity = hv.storage.pool().info()[1] // (GIB * 1024)
        assert info.disk_gb is None and info.shared_pool == SharedPool("nfs-a", capacity)
        body = discover(info, ManagerConfig(), "h1")
        assert "DISK_GB" not in body["inventories"]
        assert body["shared_pool"] == {
            "name": "nfs-a",
            "inventories": {"DISK_GB": {"total": capacity}},
        }
    finally:
        hv.close()


def test_a_pool_that_cannot_be_made_leaves_the_host_without_disk_gb(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hv = LibvirtHypervisor("test:///default", storage=StorageConfig(pool_dir=tmp_path / "p"))
    try:
        # libvirt refusing the pool (a directory it cannot make, say).
        def broken() -> int:
            raise HypervisorError("storage pool loadmaster: cannot build")

        hv.storage.capacity_gb = broken  # type: ignore[method-assign]
        info = hv.host_info()
        assert info.disk_gb is None and info.cpus > 0
        assert "no DISK_GB: storage pool loadmaster: cannot build" in caplog.text
    finally:
        hv.close()
