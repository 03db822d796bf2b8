"""Real QEMU guests booted from a disk image with a NIC (see docs/real-guests.md): the
agent's storage pool on a private libvirtd, the guest's qcow2 overlay of the image
(scripts/guest-image.sh's busybox root), its virtio NIC on a libvirt network of the host,
a live migration that copies the disk or, on a pool both hosts share, leaves it in place,
and what is left after a delete, a refusal or a migration on the source: nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from realvm_helpers import (
    NETWORK,
    POOL_DIR,
    Launched,
    PrivateLibvirtd,
    RealHosts,
    defined,
    new_spec,
    running,
    serial,
    wait_for,
)

from loadmaster.agent.hypervisor.base import CpuTune, DiskSpec, GuestSpec, HypervisorError, NicSpec
from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor
from loadmaster.images import GIB, POOL_NAME, volume_name
from loadmaster.quota import flavor_quota

pytestmark = [pytest.mark.realvm, pytest.mark.xdist_group("realvm")]

MAC = "52:54:00:5a:17:01"


@pytest.fixture
def hv(real_hosts: RealHosts) -> Iterator[LibvirtHypervisor]:
    h = real_hosts.hypervisor(real_hosts.a, storage=real_hosts.storage())
    yield h
    h.close()


def set_pool_aside(h: LibvirtHypervisor) -> None:
    """Stop and undefine the host's pool, its files kept: the next ``pool()`` defines it
    again where its config says."""
    pool = h.storage.pool()
    pool.destroy()
    pool.undefine()


@pytest.fixture
def shared_pools(real_hosts: RealHosts) -> Iterator[tuple[LibvirtHypervisor, LibvirtHypervisor]]:
    """Hosts a and b with their pool at one directory of the machine (outside the daemons'
    private /var/lib/libvirt), declared shared; their own pools come back afterwards."""
    shared_dir = Path(tempfile.mkdtemp(prefix="lm-rv-shared-"))
    storage = real_hosts.storage(shared_dir, shared="rv-shared")
    hvs: list[LibvirtHypervisor] = []
    try:
        for daemon in (real_hosts.a, real_hosts.b):
            hvs.append(real_hosts.hypervisor(daemon, storage=storage))
            set_pool_aside(hvs[-1])
            hvs[-1].storage.pool()
        yield hvs[0], hvs[1]
    finally:
        for h in hvs:
            set_pool_aside(h)
            h.close()
        shutil.rmtree(shared_dir, ignore_errors=True)


def with_devices(spec: GuestSpec, disk: DiskSpec | None, *nics: NicSpec) -> GuestSpec:
    return GuestSpec(spec.uuid, spec.name, spec.memory_kib, spec.vcpus, disk=disk, nics=nics)


def busybox_guest() -> GuestSpec:
    """A new guest with a disk of the busybox image and a NIC on the network."""
    return with_devices(new_spec(128), DiskSpec("busybox", GIB), NicSpec(NETWORK, MAC))


def volume_path(h: LibvirtHypervisor, uuid: str) -> str:
    """The file of the guest's volume in ``h``'s pool."""
    return str(h.storage.pool().storageVolLookupByName(volume_name(uuid)).path())


def volume_file(daemon: PrivateLibvirtd, uuid: str) -> Path:
    return daemon.base / "lib" / POOL_DIR.relative_to("/var/lib/libvirt") / volume_name(uuid)


def pool_volumes(hv: LibvirtHypervisor) -> set[str]:
    return set(hv.storage.pool().listVolumes())


def qemu_pids(spec: GuestSpec) -> list[int]:
    """The QEMU processes of the machine running this guest (whichever daemon's)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # not a process, or gone
        if args[0].endswith(b"qemu-system-x86_64") and f"guest={spec.name},".encode() in b",".join(
            args
        ):
            found.append(int(proc.name))
    return found


def open_files(pid: int) -> set[str]:
    return {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}


def test_guest_boots_from_its_image_with_a_nic_and_delete_removes_its_overlay(
    real_hosts: RealHosts, launched: Launched, hv: LibvirtHypervisor
) -> None:
    """Its flavor's quota in force too, on the disk, the NIC and the CPU."""
    plain = new_spec(128)
    quota = {
        "quota:disk_total_bytes_sec": "4194304",
        "quota:vif_outbound_average": "2048",
        "quota:cpu_shares": "512",
        "quota:cpu_period": "100000",
        "quota:cpu_quota": "50000",
    }
    spec = GuestSpec(
        plain.uuid,
        plain.name,
        plain.memory_kib,
        plain.vcpus,
        disk=DiskSpec("busybox", GIB),
        nics=(NicSpec(NETWORK, MAC),),
        quota=flavor_quota(quota),
    )
    seconds = launched.launch(hv, spec)
    console = serial(real_hosts, spec)
    assert "lm-guest: root on /dev/vda" in console  # init ran from the disk's root
    assert f"lm-guest: eth0 {MAC}" in console  # the NIC reached the guest, with its MAC
    print(f"launch from the image to init on the disk's root: {seconds:.1f} s")

    # The overlay: sized to the disk, backed by the image uploaded to the pool.
    vol = hv.storage.pool().storageVolLookupByName(volume_name(spec.uuid))
    desc = ET.fromstring(vol.XMLDesc(0))
    assert int(desc.findtext("capacity") or 0) == GIB
    assert desc.find("target/format").get("type") == "qcow2"  # type: ignore[union-attr]
    assert (desc.findtext("backingStore/path") or "").endswith("/base-busybox")
    assert volume_file(real_hosts.a, spec.uuid).exists()
    domain = ET.fromstring(hv._domain(spec.uuid).XMLDesc(0))
    iface = domain.find("devices/interface")
    assert iface is not None and iface.find("source").get("network") == NETWORK  # type: ignore[union-attr]
    tap = iface.find("target")
    assert tap is not None  # a tap on the network's bridge
    # The flavor's quota, in force: QEMU's throttle on the disk, the tap's shaping, the
    # guest's CPU cgroup.
    assert hv.cpu_tune(spec.uuid) == CpuTune(quota=50000, period=100000, shares=512)
    assert hv._domain(spec.uuid).blockIoTune("vda", 0)["total_bytes_sec"] == 4194304
    assert hv.interface_bandwidth(spec.uuid, tap.get("dev", ""))["outbound.average"] == 2048

    hv.remove_guest(spec.uuid)
    assert not defined(real_hosts.a, spec.uuid)
    assert volume_name(spec.uuid) not in pool_volumes(hv)
    assert not volume_file(real_hosts.a, spec.uuid).exists()


def test_refusals_name_what_is_missing_and_leave_nothing(
    real_hosts: RealHosts, hv: LibvirtHypervisor
) -> None:
    cases = [
        (DiskSpec("busybox", GIB), NicSpec("nowhere", MAC), "network 'nowhere' is not defined"),
        (DiskSpec("nonesuch", GIB), NicSpec(NETWORK, MAC), "image 'nonesuch' is not on this host"),
        (DiskSpec("busybox", 1024 * 1024), NicSpec(NETWORK, MAC), "larger than the VM's disk"),
    ]
    for disk, nic, reason in cases:
        spec = with_devices(new_spec(128), disk, nic)
        with pytest.raises(HypervisorError, match=reason):
            hv.launch_guest(spec)
        assert not defined(real_hosts.a, spec.uuid)
        assert volume_name(spec.uuid) not in pool_volumes(hv)
        assert not volume_file(real_hosts.a, spec.uuid).exists()


def test_blank_disk_guest_runs_from_its_initramfs(
    real_hosts: RealHosts, launched: Launched, hv: LibvirtHypervisor
) -> None:
    spec = with_devices(new_spec(128), DiskSpec(None, GIB))
    launched.launch(hv, spec)
    assert "root on /dev/vda" not in serial(real_hosts, spec)
    assert running(hv)[spec.uuid].disks == ("vda",)
    hv.remove_guest(spec.uuid)
    assert volume_name(spec.uuid) not in pool_volumes(hv)


def test_pool_capacity_is_the_host_disk(hv: LibvirtHypervisor) -> None:
    info = hv.host_info()
    assert info.disk_gb == hv.storage.pool().info()[1] // GIB > 0
    assert hv.storage.pool().name() == POOL_NAME


def test_live_migration_copies_the_disk_and_removes_the_source_volume(
    real_hosts: RealHosts, launched: Launched, hv: LibvirtHypervisor
) -> None:
    spec = busybox_guest()
    launched.launch(hv, spec)
    destination = real_hosts.hypervisor(real_hosts.b)
    try:
        destination.storage.pool()  # its agent makes it when it registers
        started = time.monotonic()
        hv.migrate_guest(spec.uuid, real_hosts.b.uri)
        print(f"live migration with the disk copied: {time.monotonic() - started:.1f} s")
        assert spec.uuid in running(destination) and not defined(real_hosts.a, spec.uuid)
        # The guest kept running: booted once, its init from the disk's root.
        assert serial(real_hosts, spec).count("lm-guest: up") == 1
        # Its disk is a volume of the destination's pool now; the source's is gone.
        assert volume_name(spec.uuid) in pool_volumes(destination)
        assert volume_file(real_hosts.b, spec.uuid).exists()
        assert volume_name(spec.uuid) not in pool_volumes(hv)
        assert not volume_file(real_hosts.a, spec.uuid).exists()
        iface = ET.fromstring(destination._domain(spec.uuid).XMLDesc(0)).find("devices/interface")
        assert iface is not None and iface.find("mac").get("address") == MAC  # type: ignore[union-attr]
        destination.remove_guest(spec.uuid)
        assert volume_name(spec.uuid) not in pool_volumes(destination)
    finally:
        destination.close()


def test_failed_migration_with_the_disk_leaves_it_here_and_nothing_there(
    real_hosts: RealHosts, launched: Launched, hv: LibvirtHypervisor
) -> None:
    spec = busybox_guest()
    launched.launch(hv, spec)
    destination = real_hosts.hypervisor(real_hosts.b)
    # The destination prepared, its disk made there, but unable to receive (an address it
    # cannot listen on): libvirt tears it down.
    unreachable = real_hosts.hypervisor(real_hosts.a, migration_uri="tcp://192.0.2.1")
    try:
        destination.storage.pool()
        with pytest.raises(HypervisorError, match="live migration failed"):
            unreachable.migrate_guest(spec.uuid, real_hosts.b.uri)
        assert spec.uuid in running(hv) and not defined(real_hosts.b, spec.uuid)
        assert volume_name(spec.uuid) in pool_volumes(hv)
        assert volume_file(real_hosts.a, spec.uuid).exists()
        destination.storage.pool().refresh(0)
        assert volume_name(spec.uuid) not in pool_volumes(destination)
        assert not volume_file(real_hosts.b, spec.uuid).exists()
    finally:
        unreachable.close()
        destination.close()


def test_live_migration_on_a_shared_pool_leaves_the_volume_to_the_destination(
    real_hosts: RealHosts,
    shared_pools: tuple[LibvirtHypervisor, LibvirtHypervisor],
    launched: Launched,
) -> None:
    source, destination = shared_pools
    spec = busybox_guest()
    launched.launch(source, spec)
    path = volume_path(source, spec.uuid)
    inode = os.stat(path).st_ino
    # b's pool, defined before a uploaded the image, finds that upload: not made again.
    base = Path(path).with_name("base-busybox")
    base_inode = os.stat(base).st_ino
    other = new_spec(128).uuid
    assert Path(destination.storage.make_disk(other, DiskSpec("busybox", GIB))).exists()
    destination.storage.remove_disk(other)
    assert os.stat(base).st_ino == base_inode
    started = time.monotonic()
    source.migrate_guest(spec.uuid, real_hosts.b.uri)
    print(f"live migration on a shared pool: {time.monotonic() - started:.1f} s")
    assert spec.uuid in running(destination) and not defined(real_hosts.a, spec.uuid)
    assert serial(real_hosts, spec).count("lm-guest: up") == 1  # booted once
    # One QEMU runs the guest, b's, on the very file the guest had on a.
    pid_b = int((real_hosts.b.base / "run" / "qemu" / f"{spec.name}.pid").read_text())
    wait_for("the source's QEMU gone", lambda: qemu_pids(spec) == [pid_b], 30)
    assert path in open_files(pid_b)
    assert os.stat(path).st_ino == inode
    # Not deleted by the source; listed in the destination's pool, whose agent deletes it.
    source.storage.refresh()
    assert volume_name(spec.uuid) in pool_volumes(source)
    assert volume_name(spec.uuid) in pool_volumes(destination)
    destination.remove_guest(spec.uuid)
    assert not Path(path).exists()


def test_failed_migration_on_a_shared_pool_deletes_nothing(
    real_hosts: RealHosts,
    shared_pools: tuple[LibvirtHypervisor, LibvirtHypervisor],
    launched: Launched,
) -> None:
    source, destination = shared_pools
    spec = busybox_guest()
    launched.uuids.append(spec.uuid)  # removed from both hosts afterwards
    source.launch_guest(spec)  # QEMU has its disk open from the start: no need to boot
    path = volume_path(source, spec.uuid)
    destination.storage.refresh()  # b lists the volume, as after a move there and back
    assert volume_name(spec.uuid) in pool_volumes(destination)
    # b prepared, QEMU started there on the same file, but unable to receive.
    unreachable = real_hosts.hypervisor(
        real_hosts.a,
        migration_uri="tcp://192.0.2.1",
        storage=source.storage.config,
    )
    try:
        with pytest.raises(HypervisorError, match="live migration failed"):
            unreachable.migrate_guest(spec.uuid, real_hosts.b.uri)
    finally:
        unreachable.close()
    assert spec.uuid in running(source) and not defined(real_hosts.b, spec.uuid)
    assert Path(path).exists()
    pid_a = int((real_hosts.a.base / "run" / "qemu" / f"{spec.name}.pid").read_text())
    assert path in open_files(pid_a)
    assert volume_name(spec.uuid) in pool_volumes(destination)  # the same file, kept


def test_an_evacuated_guest_on_a_shared_pool_boots_from_the_disk_it_had(
    real_hosts: RealHosts,
    shared_pools: tuple[LibvirtHypervisor, LibvirtHypervisor],
    launched: Launched,
) -> None:
    """Host a dies; its agent, back with its host down, removes the guest but leaves its
    disk; b starts the evacuated guest on that very volume, with what was written to it."""
    dead, survivor = shared_pools
    spec = busybox_guest()
    launched.uuids.append(spec.uuid)  # removed from both hosts afterwards
    dead.launch_guest(spec)  # QEMU has its disk open from the start: no need to boot
    path = volume_path(dead, spec.uuid)
    inode = os.stat(path).st_ino
    dead.remove_guest(spec.uuid, keep_disk=True)
    assert Path(path).exists()
    # The guest's data: a pattern past the end of the image, where nothing else writes.
    marker = f"{GIB - 65536} 64k"
    subprocess.run(["qemu-io", "-c", f"write -P 0x5a {marker}", path], check=True)
    survivor.launch_guest(spec)
    pid_b = int((real_hosts.b.base / "run" / "qemu" / f"{spec.name}.pid").read_text())
    assert path in open_files(pid_b)
    assert os.stat(path).st_ino == inode
    read = subprocess.run(
        ["qemu-io", "-r", "-U", "-c", f"read -P 0x5a {marker}", path],
        capture_output=True,
        text=True,
    )
    assert read.returncode == 0 and "Pattern verification failed" not in read.stdout, read.stdout
