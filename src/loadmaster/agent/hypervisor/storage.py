"""The host's storage pool for guest disks, over libvirt's storage API.

One ``dir`` pool per host, ``loadmaster``, defined, built and started on first use at
``pool_dir``. It holds the base images (``base-<image>``) and one qcow2 volume per guest
(``<uuid>.qcow2``): an overlay of its base image sized to the VM's DISK_GB, or a blank disk
when the VM names no image. Its capacity is the host's DISK_GB.

A base image reaches the pool from the operator's ``image_dir`` (``<image>.qcow2``) the
first time a guest needs it, uploaded through libvirt (so the agent needs no access to
the pool's directory, which a remote or sandboxed libvirtd resolves on its own side).

A pool the operator declares ``shared`` (by a name, the same on each host) is one storage
that every host declaring it sees at ``pool_dir`` (an NFS export, a cluster filesystem): a guest's volume is the same file on
all of them, so a live migration leaves it in place, and a guest started on another host
of the pool (evacuated from a dead one) boots from the volume it had. libvirt lists a pool's volumes as of
its last refresh, so on a shared pool a volume not listed is looked for again after one:
another host may have made it.
"""

from __future__ import annotations

import contextlib
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from loadmaster.agent.hypervisor.base import DiskSpec, HypervisorError
from loadmaster.errors import ValidationError
from loadmaster.images import GIB, POOL_NAME, virtual_size, volume_name

DEFAULT_POOL_DIR = Path("/var/lib/libvirt/images/loadmaster")
# Bytes handed to libvirt per write while uploading a base image.
UPLOAD_CHUNK = 1 << 20

T = TypeVar("T")


@dataclass(frozen=True)
class StorageConfig:
    """Where the pool lives (as its libvirtd sees it), the name of the shared storage it
    is (None: the host's own), and where base images come from."""

    pool_dir: Path = DEFAULT_POOL_DIR
    image_dir: Path | None = None
    shared: str | None = None


def base_name(image: str) -> str:
    return f"base-{image}"


class GuestStorage:
    """The pool of one libvirt connection (``conn``; ``lv`` the binding's module)."""

    def __init__(self, conn: Any, lv: Any, config: StorageConfig) -> None:
        self._conn = conn
        self._lv = lv
        self.config = config
        # Two launches of one image at once upload it once.
        self._bases = threading.Lock()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._lv.libvirtError as exc:
            raise HypervisorError(f"{what}: {exc}") from exc

    def _lookup_pool(self) -> Any | None:
        try:
            return self._conn.storagePoolLookupByName(POOL_NAME)
        except self._lv.libvirtError as exc:
            if exc.get_error_code() == self._lv.VIR_ERR_NO_STORAGE_POOL:
                return None
            raise HypervisorError(f"storage pool {POOL_NAME}: {exc}") from exc

    def pool(self) -> Any:
        """The pool, defined and started if it was not."""
        pool = self._lookup_pool()
        what = f"storage pool {POOL_NAME} at {self.config.pool_dir}"
        if pool is None:
            xml = (
                f"<pool type='dir'><name>{POOL_NAME}</name>"
                f"<target><path>{self.config.pool_dir}</path></target></pool>"
            )
            pool = self._call(f"{what}: define", lambda: self._conn.storagePoolDefineXML(xml, 0))
            self._call(f"{what}: build", lambda: pool.build(0))
            self._call(f"{what}: autostart", lambda: pool.setAutostart(1))
        if not self._call(f"{what}: state", pool.isActive):
            self._call(f"{what}: start", lambda: pool.create(0))
        return pool

    def capacity_gb(self) -> int:
        info = self._call(f"storage pool {POOL_NAME}: info", self.pool().info)
        return int(info[1]) // GIB

    def refresh(self) -> None:
        """Have libvirt list the pool's volumes afresh (files another host of a shared pool
        made); no-op when the pool is absent or stopped."""
        pool = self._lookup_pool()
        if pool is not None and self._call(f"storage pool {POOL_NAME}: state", pool.isActive):
            self._call(f"storage pool {POOL_NAME}: refresh", lambda: pool.refresh(0))

    def _volume(self, pool: Any, name: str) -> Any | None:
        vol = self._listed_volume(pool, name)
        if vol is None and self.config.shared:
            self._call(f"storage pool {POOL_NAME}: refresh", lambda: pool.refresh(0))
            vol = self._listed_volume(pool, name)
        return vol

    def _listed_volume(self, pool: Any, name: str) -> Any | None:
        try:
            return pool.storageVolLookupByName(name)
        except self._lv.libvirtError as exc:
            if exc.get_error_code() == self._lv.VIR_ERR_NO_STORAGE_VOL:
                return None
            raise HypervisorError(f"volume {name} in pool {POOL_NAME}: {exc}") from exc

    def make_disk(self, uuid: str, disk: DiskSpec) -> str:
        """The guest's disk volume, created (an overlay of its image, or blank); its path.
        An image the host cannot find, or one larger than the disk, is refused naming it,
        and nothing is created."""
        pool = self.pool()
        backing = ""
        if disk.image is not None:
            base = self._base(pool, disk.image)
            base_path = self._call(f"image {disk.image}: path", base.path)
            base_bytes = int(self._call(f"image {disk.image}: info", base.info)[1])
            if base_bytes > disk.size_bytes:
                raise HypervisorError(
                    f"image {disk.image!r} is {base_bytes} bytes, larger than the VM's disk "
                    f"of {disk.size_bytes} bytes (its DISK_GB)"
                )
            backing = f"<backingStore><path>{base_path}</path><format type='qcow2'/></backingStore>"
        name = volume_name(uuid)
        if self._volume(pool, name) is not None:
            # Left by a launch this agent did not finish; the guest was never defined on it.
            self.remove_disk(uuid)
        xml = (
            f"<volume><name>{name}</name><capacity unit='bytes'>{disk.size_bytes}</capacity>"
            f"<target><format type='qcow2'/></target>{backing}</volume>"
        )
        vol = self._call(f"disk of {uuid}: create", lambda: pool.createXML(xml, 0))
        path: str = self._call(f"disk of {uuid}: path", vol.path)
        return path

    def kept_disk(self, uuid: str) -> str | None:
        """On a shared pool, the path of the volume the guest already has there (None on
        a private pool, or when it has none). Another host of the pool made it: the guest
        was evacuated here from a host that died, or starts again after it stopped there.
        Its data is the guest's, so it boots from it as it is, as Nova's evacuate reuses
        an instance's disk on shared storage."""
        if not self.config.shared:
            return None
        vol = self._volume(self.pool(), volume_name(uuid))
        if vol is None:
            return None
        path: str = self._call(f"disk of {uuid}: path", vol.path)
        return path

    def remove_disk(self, uuid: str) -> None:
        """Delete the guest's disk volume; no-op when it (or the pool) is absent."""
        pool = self._lookup_pool()
        if pool is None or not self._call(f"storage pool {POOL_NAME}: state", pool.isActive):
            return
        vol = self._volume(pool, volume_name(uuid))
        if vol is not None:
            self._call(f"disk of {uuid}: delete", lambda: vol.delete(0))

    def _base(self, pool: Any, image: str) -> Any:
        with self._bases:
            name = base_name(image)
            vol = self._volume(pool, name)
            if vol is not None:
                return vol
            source = self.config.image_dir / f"{image}.qcow2" if self.config.image_dir else None
            if source is None or not source.is_file():
                where = f"no {source}" if source is not None else "no image directory configured"
                raise HypervisorError(
                    f"image {image!r} is not on this host (not in storage pool {POOL_NAME}, {where})"
                )
            return self._upload(pool, name, source)

    def _upload(self, pool: Any, name: str, source: Path) -> Any:
        lv = self._lv
        what = f"upload {source} to pool {POOL_NAME}"
        size = source.stat().st_size
        try:
            image_bytes = virtual_size(source)
        except ValidationError as exc:
            raise HypervisorError(f"{what}: {exc.detail}") from exc
        xml = (
            f"<volume><name>{name}</name><capacity unit='bytes'>{size}</capacity>"
            "<target><format type='raw'/></target></volume>"
        )
        vol = self._call(f"{what}: create", lambda: pool.createXML(xml, 0))
        stream = self._conn.newStream(0)
        try:
            vol.upload(stream, 0, size, 0)
            with source.open("rb") as f:
                stream.sendAll(lambda _s, n, fh: fh.read(min(n, UPLOAD_CHUNK)), f)
            stream.finish()
        except lv.libvirtError as exc:
            with contextlib.suppress(lv.libvirtError):
                stream.abort()
            with contextlib.suppress(lv.libvirtError):
                vol.delete(0)
            if exc.get_error_code() != lv.VIR_ERR_NO_SUPPORT:
                raise HypervisorError(f"{what}: {exc}") from exc
            # The test driver keeps no volume contents: a volume of the image's size
            # stands for it.
            xml = (
                f"<volume><name>{name}</name><capacity unit='bytes'>{image_bytes}</capacity>"
                "<target><format type='qcow2'/></target></volume>"
            )
            return self._call(f"{what}: create", lambda: pool.createXML(xml, 0))
        # Refreshed, the pool probes the upload's real format (qcow2) and virtual size.
        self._call(f"{what}: refresh", lambda: pool.refresh(0))
        vol = self._volume(pool, name)
        if vol is None:
            raise HypervisorError(f"{what}: the volume vanished after the upload")
        return vol


def disk_element(path: str) -> ET.Element:
    """The domain's ``<disk>`` for a guest's volume: virtio, the first disk (vda)."""
    disk = ET.Element("disk", type="file", device="disk")
    ET.SubElement(disk, "driver", name="qemu", type="qcow2")
    ET.SubElement(disk, "source", file=path)
    ET.SubElement(disk, "target", dev="vda", bus="virtio")
    return disk
