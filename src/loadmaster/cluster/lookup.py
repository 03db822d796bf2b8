"""Finding rows by the names users type; every miss is a NotFound naming the field."""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from loadmaster.errors import NotFound, ValidationError
from loadmaster.resources import Inventory
from loadmaster.store.chunks import in_chunks
from loadmaster.store.locking import execute_core, share_groups
from loadmaster.store.schema import (
    AllocationRow,
    FlavorRow,
    HostRow,
    InventoryRow,
    ResourceClassRow,
    ServerGroupRow,
    TraitRow,
    VmRow,
)
from loadmaster.store.transaction import Transaction

# What an Inventory is made of, for reads that need no whole row.
INVENTORY_COLUMNS = (
    InventoryRow.host_id,
    InventoryRow.resource_class_id,
    InventoryRow.total,
    InventoryRow.reserved,
    InventoryRow.min_unit,
    InventoryRow.max_unit,
    InventoryRow.step_size,
    InventoryRow.allocation_ratio,
)


def inventory_of(row: Any) -> Inventory:
    """The rules of an ``InventoryRow`` or of a row selected with ``INVENTORY_COLUMNS``."""
    return Inventory(
        row.total, row.reserved, row.min_unit, row.max_unit, row.step_size, row.allocation_ratio
    )


_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def canonical_uuid(ident: str) -> str:
    """A uuid as the store keeps it (lower case, hyphenated); anything else unchanged.
    Every uuid coming in goes through here, so ``ABC...`` and ``abc...`` are one VM."""
    if isinstance(ident, str) and _CANONICAL.fullmatch(ident):
        return ident  # (most are: parsing one costs ten times the match)
    try:
        return str(uuidlib.UUID(ident))
    except (ValueError, TypeError, AttributeError):
        return ident


def host_row(session: Session, ident: str, field: str = "host") -> HostRow:
    """A host by uuid or name."""
    if not isinstance(ident, str) or not ident:
        raise ValidationError(f"{field} must be a host uuid or name", field=field)
    row = session.scalar(
        select(HostRow).where((HostRow.uuid == canonical_uuid(ident)) | (HostRow.name == ident))
    )
    if row is None:
        raise NotFound(
            f"{field} {ident!r}: no such host",
            field=field,
            placement_detail=f"No resource provider with uuid {ident} found",
        )
    return row


def root_host_row(session: Session, ident: str, instead: str) -> HostRow:
    """The root host ``ident`` names (uuid or name); a child provider is refused, the error
    saying what to do ``instead`` (``"drain its root host"``)."""
    row = host_row(session, ident)
    if row.parent_id is not None:
        raise ValidationError(f"host {row.name} is a child provider; {instead}", field="host")
    return row


def vm_row(session: Session, ident: str, field: str = "vm", *, lock: bool = False) -> VmRow:
    """With ``lock`` the row stays locked until the transaction ends (PostgreSQL; SQLite
    writers are serialised anyway): whoever changes a VM's state or records holds it, so
    no writer acts on a state another has just changed."""
    query = select(VmRow).where(VmRow.uuid == vm_uuid(ident, field))
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise NotFound(f"{field} {ident!r}: no such VM", field=field)
    if lock:
        share_groups(session, [row])
    return row


def vm_names(session: Transaction, uuids: Sequence[str]) -> dict[str, str]:
    """uuid -> name of the VMs among ``uuids`` (canonical), for messages."""
    names: dict[str, str] = {}
    for chunk in in_chunks(uuids):
        query = select(VmRow.uuid, VmRow.name).where(VmRow.uuid.in_(chunk))
        names.update((uuid, name) for uuid, name in execute_core(session, query))
    return names


def vm_uuid(ident: object, field: str = "vm") -> str:
    """A VM's uuid as stored, from what a caller gave; not a string, or empty: refused."""
    if not isinstance(ident, str) or not ident:
        raise ValidationError(f"{field} must be a VM uuid", field=field)
    return canonical_uuid(ident)


def flavor_row(
    session: Session, name: str, field: str = "flavor", *, lock: bool = False
) -> FlavorRow:
    query = select(FlavorRow).where(FlavorRow.name == name)
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise no_such_flavor(name, field)
    return row


def no_such_flavor(name: str, field: str = "flavor") -> NotFound:
    return NotFound(f"{field} {name!r}: no such flavor", field=field)


def group_row(
    session: Session, ident: str, field: str = "group", *, lock: bool = False
) -> ServerGroupRow:
    query = select(ServerGroupRow).where(
        (ServerGroupRow.uuid == canonical_uuid(ident)) | (ServerGroupRow.name == ident)
    )
    row = session.scalar(query.with_for_update() if lock else query)
    if row is None:
        raise no_such_group(ident, field)
    return row


def no_such_group(ident: str, field: str = "group") -> NotFound:
    return NotFound(f"{field} {ident!r}: no such server group", field=field)


def live_vms_using(session: Session, column: Any, row_id: int) -> int:
    """How many VMs not deleted have ``column`` (a foreign key of ``VmRow``) = ``row_id``:
    what keeps a flavor or a server group from being deleted."""
    return (
        session.scalar(
            select(func.count())
            .select_from(VmRow)
            .where(column == row_id, VmRow.state != "deleted")
        )
        or 0
    )


def let_go_of(session: Session, column: Any, row_id: int) -> None:
    """Deleted VMs stop pointing at the row about to go (``column`` = ``row_id`` -> null),
    but stay: a retried ``DELETE /vms/{uuid}`` still finds its VM (204, not 404)."""
    session.execute(
        update(VmRow)
        .where(column == row_id, VmRow.state == "deleted")
        .values({column.key: None})
        .execution_options(synchronize_session=False)
    )


def class_ids(session: Transaction) -> dict[str, int]:
    return {
        name: id_
        for id_, name in execute_core(session, select(ResourceClassRow.id, ResourceClassRow.name))
    }


def class_names(session: Session) -> dict[int, str]:
    return {id_: name for name, id_ in class_ids(session).items()}


def require_classes(
    session: Transaction,
    names: Iterable[str],
    field: str,
    *,
    lock: bool = False,
    known: dict[str, int] | None = None,
) -> dict[str, int]:
    """Ids of the named classes; an unknown one is an error naming ``field.<class>``.

    ``lock``: hold the named classes FOR KEY SHARE until the transaction ends, for writes
    that name a class where no foreign key can guard it (a VM's overrides, a flavor's
    resources, both JSON): a class delete waits for them, or they see it gone.
    ``known``: ``class_ids`` read already (one read for many checks)."""
    names = list(names)
    if lock and names:
        execute_core(
            session,
            select(ResourceClassRow.id)
            .where(ResourceClassRow.name.in_(sorted(set(names))))
            .order_by(ResourceClassRow.id)
            .with_for_update(read=True, key_share=True),
        )
    if known is None:
        known = class_ids(session)
    for name in names:
        if name not in known:
            raise NotFound(f"{field}.{name}: no such resource class", field=f"{field}.{name}")
    return known


def require_traits(
    session: Transaction, names: Iterable[str], field: str, *, known: dict[str, int] | None = None
) -> dict[str, int]:
    """Ids of the named traits; an unknown one is an error naming ``field``. ``known``:
    ``trait_ids`` read already for these names and more."""
    wanted = set(names)
    if not wanted:
        return {}
    found = trait_ids(session, wanted) if known is None else known
    missing = sorted(wanted - set(found))
    if missing:
        raise NotFound(f"{field}: no such trait {missing[0]}", field=field)
    return found


def trait_ids(session: Transaction, names: Iterable[str]) -> dict[str, int]:
    """Ids of those of ``names`` that are traits."""
    return {
        name: id_
        for id_, name in execute_core(
            session, select(TraitRow.id, TraitRow.name).where(TraitRow.name.in_(set(names)))
        )
    }


def used_by_provider(
    session: Session, host_ids: Iterable[int]
) -> dict[tuple[int, int], dict[str, int]]:
    """``(host_id, class_id) -> {'active': n, 'pending': m}`` summed from the records."""
    ids = list(host_ids)
    sums: dict[tuple[int, int], dict[str, int]] = {}
    if not ids:
        return sums
    query = (
        select(
            AllocationRow.host_id,
            AllocationRow.resource_class_id,
            AllocationRow.state,
            func.sum(AllocationRow.amount),
        )
        .where(AllocationRow.host_id.in_(ids))
        .group_by(AllocationRow.host_id, AllocationRow.resource_class_id, AllocationRow.state)
    )
    for host_id, class_id, state, total in session.execute(query):
        sums.setdefault((host_id, class_id), {"active": 0, "pending": 0})[state] = int(total)
    return sums


def effective_resources(
    flavor_resources: Mapping[str, int], overrides: Mapping[str, int]
) -> dict[str, int]:
    merged = {**flavor_resources, **overrides}
    return {name: amount for name, amount in merged.items() if amount > 0}
