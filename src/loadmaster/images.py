"""Guest images: their names and sizes, as the API's catalogue and the hosts' agents see them.

An image is a bootable disk (qcow2 or raw) that VMs' disks are copy-on-write overlays of.
Its name is part of file and volume names on every host, hence the narrow alphabet.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from loadmaster.errors import ValidationError

IMAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
GIB = 1024**3
_QCOW2_MAGIC = b"QFI\xfb"


def check_image_name(name: str, field: str = "image") -> str:
    if not isinstance(name, str) or not IMAGE_NAME.fullmatch(name):
        raise ValidationError(
            f"{field} {name!r} is not an image name (letters, digits, '.', '_', '-'; "
            "at most 100, starting with a letter or digit)",
            field=field,
        )
    return name


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
