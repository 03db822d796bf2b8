"""Host rows: checked before they are written, read into records in a few queries, locked
with their generation checked, their inventories replaced, those whose agent cannot act
found (``silences``). The hosts' service (``hosts.py``) and the ledger's reshaper
(``pending/reshape.py``) both write through these."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.liveness import Silence, agent_live, epoch
from loadmaster.cluster.records import HOST_STATES, HostRecord
from loadmaster.errors import ConcurrentUpdate, Conflict, InventoryInUse, ValidationError
from loadmaster.resources import Inventory, in_class_order, validate_trait_name
from loadmaster.store.chunks import in_chunks
from loadmaster.store.schema import (
    HostAgentRow,
    HostAggregateRow,
    HostRow,
    HostTraitRow,
    InventoryRow,
    TraitRow,
)


def validate_host_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise ValidationError(
            "name must be a non-empty string of at most 255 characters", field="name"
        )
    return name


def validate_state(state: object) -> str:
    if state not in HOST_STATES:
        raise ValidationError(
            f"state must be one of {', '.join(HOST_STATES)}, got {state!r}", field="state"
        )
    assert isinstance(state, str)
    return state


def validate_aggregates(aggregates: Iterable[object]) -> list[str]:
    result = []
    for i, agg in enumerate(aggregates):
        if not isinstance(agg, str) or not agg or len(agg) > 255:
            raise ValidationError(
                f"aggregates[{i}] must be a non-empty string", field=f"aggregates[{i}]"
            )
        result.append(agg)
    return sorted(set(result))


def parse_inventories(data: object, field: str = "inventories") -> dict[str, Inventory]:
    if not isinstance(data, Mapping):
        raise ValidationError(f"{field} must be an object of class: inventory", field=field)
    parsed = {}
    for name, inv in data.items():
        if not isinstance(inv, Mapping | Inventory):
            raise ValidationError(f"{field}.{name} must be an object", field=f"{field}.{name}")
        parsed[str(name)] = Inventory.parse(inv, f"{field}.{name}")
    return parsed


def host_records(session: Session, rows: list[HostRow]) -> list[HostRecord]:
    """Records for many hosts with four queries, not four per host."""
    if not rows:
        return []
    ids = [r.id for r in rows]
    names = lookup.class_names(session)
    invs: dict[int, dict[str, Inventory]] = {i: {} for i in ids}
    traits: dict[int, list[str]] = {i: [] for i in ids}
    aggs: dict[int, list[str]] = {i: [] for i in ids}
    for chunk in in_chunks(ids):
        for inv in session.scalars(select(InventoryRow).where(InventoryRow.host_id.in_(chunk))):
            invs[inv.host_id][names[inv.resource_class_id]] = lookup.inventory_of(inv)
        for host_id, trait in session.execute(
            select(HostTraitRow.host_id, TraitRow.name)
            .join(TraitRow)
            .where(HostTraitRow.host_id.in_(chunk))
        ):
            traits[host_id].append(trait)
        for host_id, agg in session.execute(
            select(HostAggregateRow.host_id, HostAggregateRow.aggregate).where(
                HostAggregateRow.host_id.in_(chunk)
            )
        ):
            aggs[host_id].append(agg)
    related = {r.parent_id for r in rows if r.parent_id} | {r.root_id for r in rows if r.root_id}
    uuids: dict[int, str] = {}
    # A child's state is its root's: the scheduler judges a tree by its root alone, and
    # a host set down or in maintenance takes its NUMA cells with it.
    states: dict[int, str] = {}
    if related:
        for host_id, uuid, state in session.execute(
            select(HostRow.id, HostRow.uuid, HostRow.state).where(HostRow.id.in_(related))
        ):
            uuids[host_id], states[host_id] = uuid, state
    return [
        HostRecord(
            uuid=r.uuid,
            name=r.name,
            state=states.get(r.root_id, r.state) if r.root_id else r.state,
            generation=r.generation,
            parent=uuids.get(r.parent_id) if r.parent_id else None,
            root=uuids.get(r.root_id, r.uuid) if r.root_id else r.uuid,
            traits=tuple(sorted(traits[r.id])),
            aggregates=tuple(sorted(aggs[r.id])),
            inventories=invs[r.id],
        )
        for r in rows
    ]


class NewHost(NamedTuple):
    name: str
    uuid: str
    state: str
    inventories: dict[str, Inventory]
    traits: list[str]
    aggregates: list[str]


def check_host(
    name: object,
    uuid: object,
    state: object,
    traits: Iterable[object],
    aggregates: Iterable[object],
    inventories: object,
) -> NewHost:
    """The checks every new host passes, whether created alone or in bulk."""
    return NewHost(
        validate_host_name(name),
        validate_uuid(uuid) if uuid is not None else str(uuidlib.uuid4()),
        validate_state(state),
        parse_inventories(inventories or {}),
        [validate_trait_name(t, f"traits[{i}]") for i, t in enumerate(traits)],
        validate_aggregates(aggregates),
    )


def validate_uuid(value: object, field: str = "uuid") -> str:
    try:
        return str(uuidlib.UUID(str(value)))
    except ValueError:
        raise ValidationError(f"{field} {value!r} is not a UUID", field=field) from None


def locked_host(session: Session, ident: str, generation: int | None) -> HostRow:
    """The host row, its generation checked when one is given (a stale one is a 409)."""
    row = lookup.host_row(session, ident)
    if generation is not None and row.generation != generation:
        raise ConcurrentUpdate(
            "Resource provider's generation already changed. Please update the "
            f"generation and try again. (resource provider generation conflict on host "
            f"{row.name}: actual: {row.generation}, given: {generation})",
            field="generation",
        )
    return row


def inventories_of(session: Session, row: HostRow) -> dict[str, Inventory]:
    """The host's inventories as they stand, by class name."""
    names = lookup.class_names(session)
    return {
        names[inv.resource_class_id]: lookup.inventory_of(inv)
        for inv in session.scalars(select(InventoryRow).where(InventoryRow.host_id == row.id))
    }


def write_inventories(
    session: Session,
    row: HostRow,
    wanted: Mapping[str, Inventory],
    *,
    below_use_ok: bool = False,
) -> None:
    """Replace the host's inventories; refused while a class it drops, or shrinks below
    what is allocated (pending counted), is in use. ``below_use_ok``: a shrink below what
    is allocated passes (a reshape's interim inventories: the allocations are rewritten
    next in the same transaction and checked against them then)."""
    ids = lookup.require_classes(session, wanted, "inventories")
    names = {v: k for k, v in ids.items()}
    sums = lookup.used_by_provider(session, [row.id])
    in_use = {names[class_id]: dict(used) for (_, class_id), used in sums.items()}
    held = {
        name: total
        for name, used in in_class_order(in_use).items()
        if (total := used.get("active", 0) + used.get("pending", 0)) > 0
    }
    dropped = [name for name in held if name not in wanted]
    if dropped:
        # Placement's words first, every class in use named: its clients (nova's report
        # client) read its code.
        raise InventoryInUse(
            f"Inventory for '{', '.join(dropped)}' on resource provider '{row.uuid}' in use. "
            f"(inventories.{dropped[0]}: cannot remove, {held[dropped[0]]} is allocated on "
            f"host {row.name})",
            field=f"inventories.{dropped[0]}",
        )
    for name, total_used in held.items():
        capacity = wanted[name].capacity
        used = in_use[name]
        if capacity < total_used and not below_use_ok:
            raise Conflict(
                f"inventories.{name}: new capacity {capacity} is below the {total_used} allocated "
                f"({used.get('active', 0)} active, {used.get('pending', 0)} pending) on host {row.name}",
                field=f"inventories.{name}",
            )
    session.execute(delete(InventoryRow).where(InventoryRow.host_id == row.id))
    session.add_all(
        InventoryRow(host_id=row.id, resource_class_id=ids[name], **inv.as_dict())
        for name, inv in wanted.items()
    )


def silences(
    session: Session, host_ids: Collection[int], silent_after: float, at: datetime
) -> dict[int, Silence]:
    """Of these root hosts, those whose agent cannot act at ``at``; none while the
    deployment uses no agents."""
    if not host_ids or session.scalar(select(HostAgentRow.host_id).limit(1)) is None:
        return {}
    found: dict[int, Silence] = {}
    for chunk in in_chunks(sorted(host_ids)):
        rows = session.execute(
            select(HostRow.id, HostRow.name, HostAgentRow.last_seen_at)
            .outerjoin(HostAgentRow, HostAgentRow.host_id == HostRow.id)
            .where(HostRow.id.in_(chunk))
        )
        for host_id, name, last_seen in rows:
            seen = None if last_seen is None else epoch(last_seen)
            if not agent_live(seen, epoch(at), silent_after):
                found[host_id] = Silence(name, last_seen)
    return found
