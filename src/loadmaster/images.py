"""Guests' images, disks and NICs, as the API's ledger and the hosts' agents both see them.

An image is a bootable disk (qcow2 or raw) that VMs' disks are copy-on-write overlays of.
Its name is part of file and volume names on every host, hence the narrow alphabet; a
network's name is the libvirt network's on the hosts. A VM's disk is the volume
``<uuid>.qcow2`` of the storage pool ``loadmaster`` of whatever host it runs on.
"""

from __future__ import annotations

import random
import re
import struct
from pathlib import Path

from loadmaster.errors import ValidationError

DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
GIB = 1024**3
POOL_NAME = "loadmaster"
# The network a VM's NIC joins when neither it nor its flavor names one: libvirt's own.
DEFAULT_NETWORK = "default"
# Flavor extra specs: the image and network of its VMs that name none.
IMAGE_SPEC = "lm:image"
NETWORK_SPEC = "lm:network"
# QEMU's locally administered prefix, as libvirt uses for the MACs it makes up.
MAC_PREFIX = "52:54:00"
_QCOW2_MAGIC = b"QFI\xfb"


def check_name(name: object, kind: str, field: str) -> str:
    """An image's or a network's name, or a ValidationError naming ``field``."""
    if not isinstance(name, str) or not DEVICE_NAME.fullmatch(name):
        raise ValidationError(
            f"{field} {name!r} is not {kind} name (letters, digits, '.', '_', '-'; "
            "at most 100, starting with a letter or digit)",
            field=field,
        )
    return name


def check_image_name(name: object, field: str = "image") -> str:
    return check_name(name, "an image", field)


def new_mac() -> str:
    return MAC_PREFIX + "".join(f":{random.randrange(256):02x}" for _ in range(3))


def volume_name(uuid: str) -> str:
    """A VM's disk volume in its host's pool."""
    return f"{uuid}.qcow2"


def virtual_size(path: Path) -> int:
    """The size in bytes the guest sees: a qcow2's from its header, a raw file's own."""
    try:
        with Path(path).open("rb") as f:
            header = f.read(32)
            size = Path(path).stat().st_size
    except OSError as exc:
        raise ValidationError(f"image file {path}: {exc.strerror}", field="file") from exc
    if header[:4] == _QCOW2_MAGIC and len(header) == 32:
        return int(struct.unpack(">Q", header[24:32])[0])
    return size


def disk_bytes(disk_gb: int | None, image_bytes: int | None) -> int:
    """A VM's disk: its DISK_GB, or, when its flavor claims none, its image's size."""
    if disk_gb:
        return disk_gb * GIB
    return image_bytes or 0
