"""The image catalogue: the base images VMs' disks may be made from, by name and size.

The API knows an image's name and the size its guest sees, so a VM naming an image
nobody registered, or one its DISK_GB cannot hold, is refused before anything is written.
The image's file reaches each host separately (its agent's image directory).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from loadmaster.errors import Conflict, NotFound, ValidationError
from loadmaster.images import check_image_name
from loadmaster.store import Store
from loadmaster.store.locking import now
from loadmaster.store.schema import ImageRow, VmRow


@dataclass(frozen=True)
class ImageRecord:
    name: str
    size_bytes: int
    created_at: datetime


def no_such_image(name: str, field: str = "image") -> NotFound:
    return NotFound(
        f"{field}: no such image {name!r} (register it first: PUT /images/{{name}})", field=field
    )


def image_row(session: Session, name: str, field: str = "image") -> ImageRow:
    row = session.scalar(select(ImageRow).where(ImageRow.name == name))
    if row is None:
        raise no_such_image(name, field)
    return row


class ImageService:
    def __init__(self, store: Store) -> None:
        self._store = store

    def put(self, name: str, size_bytes: int) -> tuple[ImageRecord, bool]:
        """Register an image; the same again is answered as it is. Returns it and whether
        it is new. Another size under a name in use is a conflict: VMs were sized to it."""
        check_image_name(name, "name")
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 1:
            raise ValidationError(
                f"size_bytes must be a whole number of bytes above 0, got {size_bytes!r}",
                field="size_bytes",
            )
        with self._store.write() as session:
            row = session.scalar(select(ImageRow).where(ImageRow.name == name))
            if row is not None:
                if row.size_bytes != size_bytes:
                    raise Conflict(
                        f"image {name} is registered with size_bytes {row.size_bytes}; "
                        "delete it first to change it",
                        field="size_bytes",
                    )
                return _record(row), False
            row = ImageRow(name=name, size_bytes=size_bytes, created_at=now())
            session.add(row)
            session.flush()
            return _record(row), True

    def get(self, name: str) -> ImageRecord:
        with self._store.read() as session:
            return _record(image_row(session, name, "name"))

    def list(self) -> builtins.list[ImageRecord]:
        with self._store.read() as session:
            return [_record(r) for r in session.scalars(select(ImageRow).order_by(ImageRow.name))]

    def delete(self, name: str) -> None:
        with self._store.write() as session:
            row = image_row(session, name, "name")
            users = (
                session.scalar(
                    select(func.count())
                    .select_from(VmRow)
                    .where(VmRow.image == name, VmRow.state != "deleted")
                )
                or 0
            )
            if users:
                raise Conflict(f"image {name} is used by {users} VMs", field="name")
            session.delete(row)


def _record(row: ImageRow) -> ImageRecord:
    return ImageRecord(row.name, row.size_bytes, row.created_at)
