"""The hosts' service (resource providers): create, list, move, delete; their inventories,
traits, aggregates and state, each write moving the generation. The row-level parts
(checks, records, locking, inventory writes) are in ``host_rows.py``.

This module is the hosts' service, each method one write or read
of providers."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session, aliased

from loadmaster.cluster import lookup
from loadmaster.cluster.host_rows import (
    NewHost,
    check_host,
    host_records,
    inventories_of,
    locked_host,
    parse_inventories,
    validate_aggregates,
    validate_state,
    write_inventories,
)
from loadmaster.cluster.records import ClassUsage, HostRecord
from loadmaster.errors import (
    Conflict,
    DuplicateName,
    HostHasChildren,
    HostInUse,
    NotFound,
    ValidationError,
)
from loadmaster.resources import Inventory, validate_trait_name
from loadmaster.store import Store
from loadmaster.store.chunks import in_chunks
from loadmaster.store.locking import bump_generations, mark_changed, now
from loadmaster.store.schema import (
    AllocationRow,
    HostAggregateRow,
    HostRow,
    HostTraitRow,
    InventoryRow,
)


class HostService:
    def __init__(self, store: Store) -> None:
        self._store = store

    # -- reading -----------------------------------------------------------------------
    def get(self, ident: str) -> HostRecord:
        with self._store.read() as session:
            return self._record(session, lookup.host_row(session, ident))

    def list(
        self,
        *,
        state: str | None = None,
        roots_only: bool = False,
        aggregate: str | None = None,
        name: str | None = None,
        uuid: str | None = None,
        in_tree: str | None = None,
        by_creation: bool = False,
    ) -> list[HostRecord]:
        """Hosts and child providers by name (``by_creation``: in the order they were
        created, as Placement lists providers); the filters are applied by the database, so
        asking for one provider of 100,000 reads one (``in_tree``: the providers of the
        tree that provider ``in_tree``, a uuid, belongs to)."""
        with self._store.read() as session:
            query = select(HostRow).order_by(HostRow.id if by_creation else HostRow.name)
            if name is not None:
                query = query.where(HostRow.name == name)
            if uuid is not None:
                query = query.where(HostRow.uuid == lookup.canonical_uuid(uuid))
            if in_tree is not None:
                member = aliased(HostRow)
                query = query.where(
                    HostRow.root_id
                    == select(func.coalesce(member.root_id, member.id))
                    .where(member.uuid == lookup.canonical_uuid(in_tree))
                    .scalar_subquery()
                )
            if state is not None:
                # A child provider is in its root's state (``host_records``).
                root = aliased(HostRow)
                query = query.join(
                    root, root.id == func.coalesce(HostRow.root_id, HostRow.id)
                ).where(root.state == validate_state(state))
            if roots_only:
                query = query.where(HostRow.parent_id.is_(None))
            if aggregate is not None:
                query = query.join(HostAggregateRow).where(HostAggregateRow.aggregate == aggregate)
            return self._records(session, list(session.scalars(query)))

    def usage(self, ident: str) -> dict[str, ClassUsage]:
        """Capacity, active and pending per class for one provider, summed from the records."""
        with self._store.read() as session:
            row = lookup.host_row(session, ident)
            names = lookup.class_names(session)
            sums = lookup.used_by_provider(session, [row.id])
            usage = {}
            for inv in session.scalars(select(InventoryRow).where(InventoryRow.host_id == row.id)):
                used = sums.get((row.id, inv.resource_class_id), {})
                usage[names[inv.resource_class_id]] = ClassUsage(
                    lookup.inventory_of(inv).capacity, used.get("active", 0), used.get("pending", 0)
                )
            return usage

    # -- writing -----------------------------------------------------------------------
    def create(
        self,
        name: str,
        *,
        uuid: str | None = None,
        state: str = "up",
        parent: str | None = None,
        traits: Iterable[str] = (),
        aggregates: Iterable[str] = (),
        inventories: Mapping[str, Mapping[str, object]] | None = None,
    ) -> HostRecord:
        host = check_host(name, uuid, state, traits, aggregates, inventories)
        host_uuid, parsed, trait_names, aggs = (
            host.uuid,
            host.inventories,
            host.traits,
            host.aggregates,
        )
        with self._store.write() as session:
            taken = session.execute(
                select(HostRow.name, HostRow.uuid).where(
                    (HostRow.name == name) | (HostRow.uuid == host_uuid)
                )
            ).first()
            if taken is not None and taken.uuid == host_uuid:
                raise Conflict(
                    f"Conflicting resource provider uuid: {host_uuid} already exists",
                    field="uuid",
                )
            if taken is not None:
                raise DuplicateName(
                    f"Conflicting resource provider name: {name} already exists", field="name"
                )
            if parent is not None and lookup.canonical_uuid(parent) == host_uuid:
                raise ValidationError(
                    f'Unable to create resource provider "{name}", {host_uuid}: parent '
                    "provider UUID cannot be same as UUID. Please choose a different parent "
                    "provider UUID.",
                    field="parent_provider_uuid",
                )
            parent_row = lookup.host_row(session, parent, "parent") if parent is not None else None
            stamp = now()
            row = HostRow(
                uuid=host_uuid,
                name=name,
                state=state,
                generation=0,
                created_at=stamp,
                updated_at=stamp,
            )
            row.parent_id = parent_row.id if parent_row else None
            session.add(row)
            session.flush()
            row.root_id = parent_row.root_id if parent_row else row.id
            write_inventories(session, row, parsed)
            self._write_traits(session, row, trait_names)
            session.add_all(HostAggregateRow(host_id=row.id, aggregate=a) for a in aggs)
            session.flush()
            mark_changed(session, [row.id], layout=True)
            return self._record(session, row)

    def create_many(self, hosts: Sequence[Mapping[str, Any]]) -> builtins.list[HostRecord]:
        """Create many root hosts in one transaction, all or none: each item takes the keyword
        arguments of ``create`` (``parent`` excepted) and is checked exactly as ``create``
        checks it. Rows go in with a few bulk statements, so 10,000 hosts take seconds."""
        checked: builtins.list[NewHost] = []
        for i, spec in enumerate(hosts):
            unknown = sorted(set(spec) - _BULK_FIELDS)
            if unknown:
                raise ValidationError(
                    f"hosts[{i}].{unknown[0]} is not a host field", field=f"hosts[{i}].{unknown[0]}"
                )
            try:
                checked.append(
                    check_host(
                        spec.get("name"),
                        spec.get("uuid"),
                        spec.get("state", "up"),
                        spec.get("traits", ()),
                        spec.get("aggregates", ()),
                        spec.get("inventories"),
                    )
                )
            except ValidationError as exc:
                raise ValidationError(
                    f"hosts[{i}]: {exc.detail}", field=f"hosts[{i}].{exc.field}"
                ) from None
        names = [h.name for h in checked]
        uuids = [h.uuid for h in checked]
        for what, values in (("name", names), ("uuid", uuids)):
            first: dict[str, int] = {}
            for i, value in enumerate(values):
                if first.setdefault(value, i) != i:
                    raise Conflict(
                        f"hosts[{i}].{what} {value!r} is also hosts[{first[value]}]'s",
                        field=f"hosts[{i}].{what}",
                    )
        with self._store.write() as session:
            for some_names, some_uuids in zip(in_chunks(names), in_chunks(uuids), strict=True):
                taken = session.execute(
                    select(HostRow.name, HostRow.uuid).where(
                        HostRow.name.in_(some_names) | HostRow.uuid.in_(some_uuids)
                    )
                ).first()
                if taken is not None:
                    what = "name" if taken.name in names else "uuid"
                    i = names.index(taken.name) if what == "name" else uuids.index(taken.uuid)
                    raise Conflict(
                        f"hosts[{i}].{what} {getattr(taken, what)!r} is already used by a host",
                        field=f"hosts[{i}].{what}",
                    )
            # One query for each vocabulary, then each host's names checked as its own, so
            # an unknown one is named under the host that holds it: hosts[1].inventories.X.
            class_ids = lookup.class_ids(session)
            trait_ids = lookup.trait_ids(session, {t for h in checked for t in h.traits})
            for i, h in enumerate(checked):
                lookup.require_classes(
                    session, h.inventories, f"hosts[{i}].inventories", known=class_ids
                )
                lookup.require_traits(session, h.traits, f"hosts[{i}].traits", known=trait_ids)
            stamp = now()
            ids = session.scalars(
                insert(HostRow).returning(HostRow.id, sort_by_parameter_order=True),
                [
                    {
                        "uuid": h.uuid,
                        "name": h.name,
                        "state": h.state,
                        "generation": 0,
                        "created_at": stamp,
                        "updated_at": stamp,
                    }
                    for h in checked
                ],
            ).all()
            for chunk in in_chunks(list(ids)):
                session.execute(
                    update(HostRow)
                    .where(HostRow.id.in_(chunk))
                    .values(root_id=HostRow.id)
                    .execution_options(synchronize_session=False)
                )
            pairs = list(zip(ids, checked, strict=True))
            children: builtins.list[tuple[type[Any], builtins.list[dict[str, Any]]]] = [
                (
                    InventoryRow,
                    [
                        {"host_id": i, "resource_class_id": class_ids[rc], **inv.as_dict()}
                        for i, h in pairs
                        for rc, inv in h.inventories.items()
                    ],
                ),
                (
                    HostTraitRow,
                    [
                        {"host_id": i, "trait_id": t}
                        for i, h in pairs
                        for t in sorted({trait_ids[name] for name in h.traits})
                    ],
                ),
                (
                    HostAggregateRow,
                    [{"host_id": i, "aggregate": a} for i, h in pairs for a in h.aggregates],
                ),
            ]
            for table, rows in children:
                if rows:
                    session.execute(insert(table), rows)
            mark_changed(session, ids, layout=True)
            host_rows: builtins.list[HostRow] = []
            for chunk in in_chunks(list(ids)):
                host_rows.extend(session.scalars(select(HostRow).where(HostRow.id.in_(chunk))))
            host_rows.sort(key=lambda r: r.id)
            records = self._records(session, host_rows)
        if len(ids) >= BULK_LOAD:
            self._store.refresh_statistics(HostRow, InventoryRow, HostTraitRow, HostAggregateRow)
        return records

    def delete(self, ident: str) -> None:
        with self._store.write() as session:
            row = lookup.host_row(session, ident)
            if session.scalar(
                select(func.count()).select_from(HostRow).where(HostRow.parent_id == row.id)
            ):
                raise HostHasChildren(
                    f"Unable to delete parent resource provider {row.uuid}: It has child "
                    f"resource providers. (host {row.name}: delete them first)",
                    field="host",
                )
            if session.scalar(
                select(func.count())
                .select_from(AllocationRow)
                .where(AllocationRow.host_id == row.id)
            ):
                raise HostInUse(
                    f"Unable to delete resource provider {row.uuid}: Resource provider has "
                    f"allocations. (host {row.name}: release them first)",
                    field="host",
                )
            session.delete(row)
            mark_changed(session, (), layout=True)

    def update(self, ident: str, name: str, parent: str | None) -> HostRecord:
        """Placement's ``PUT /resource_providers/{uuid}``: a new name, a new parent (or
        none). The uuid and, as in Placement, the generation never change. A provider moves to another tree only with nothing allocated from it
        or below it: a VM's claim belongs to one host (a root) and must not change hosts
        without the ledger moving it."""
        with self._store.write() as session:
            row = lookup.host_row(session, ident)
            renamed = name != row.name
            if renamed:
                taken = session.scalar(select(HostRow.id).where(HostRow.name == name))
                if taken is not None:
                    raise DuplicateName(
                        f"Conflicting resource provider name: {name} already exists",
                        field="name",
                    )
                row.name = name
            parent_row = None
            if parent is not None:
                parent_row = session.scalar(
                    select(HostRow).where(HostRow.uuid == lookup.canonical_uuid(parent))
                )
                if parent_row is None:
                    raise ValidationError(
                        "parent provider UUID does not exist.", field="parent_provider_uuid"
                    )
            moved: set[int] = set()
            if (parent_row.id if parent_row else None) != row.parent_id:
                moved = self._move_subtree(session, row, parent_row)
            # Placement moves no generation here (they guard inventories, traits and
            # aggregates); schedulers learn of the new name or tree from the clock, as a
            # change of layout (names and trees are read only by a full load).
            if renamed or moved:
                mark_changed(session, {row.id} | moved, layout=True)
            row.updated_at = now()
            session.flush()
            session.refresh(row)
            return self._record(session, row)

    def _move_subtree(self, session: Session, row: HostRow, parent: HostRow | None) -> set[int]:
        """Move ``row`` and everything below it under ``parent``; the providers moved."""
        subtree = [row.id]
        for host_id in subtree:  # grows while walked: breadth first
            subtree += session.scalars(select(HostRow.id).where(HostRow.parent_id == host_id))
        if parent is not None and parent.id in subtree:
            raise ValidationError(
                "creating loop in the provider tree is not allowed.",
                field="parent_provider_uuid",
            )
        if session.scalar(
            select(func.count())
            .select_from(AllocationRow)
            .where(AllocationRow.host_id.in_(subtree))
        ):
            raise HostInUse(
                f"Unable to move resource provider {row.uuid} to another tree: it or a "
                "provider below it has allocations",
                field="parent_provider_uuid",
            )
        old_root = row.root_id
        row.parent_id = parent.id if parent is not None else None
        new_root = parent.root_id if parent is not None else row.id
        session.execute(update(HostRow).where(HostRow.id.in_(subtree)).values(root_id=new_root))
        session.refresh(row)
        return set(subtree) | {r for r in (old_root, new_root) if r is not None}

    def set_state(self, ident: str, state: str, *, generation: int | None = None) -> HostRecord:
        validate_state(state)
        with self._store.write() as session:
            row = locked_host(session, ident, generation)
            if row.parent_id is not None:
                raise ValidationError(
                    f"host {row.name} is a child provider: it is in its root host's state; "
                    "set the root host's",
                    field="host",
                )
            row.state = state
            return self._bump(session, row)

    def set_inventories(
        self,
        ident: str,
        inventories: Mapping[str, Mapping[str, object] | Inventory],
        *,
        generation: int | None = None,
    ) -> HostRecord:
        """Replace the whole inventory set, as Placement's PUT does."""
        parsed = parse_inventories(inventories)
        with self._store.write() as session:
            row = locked_host(session, ident, generation)
            write_inventories(session, row, parsed)
            return self._bump(session, row)

    def set_inventory(
        self,
        ident: str,
        resource_class: str,
        inventory: Mapping[str, object] | Inventory,
        *,
        generation: int | None = None,
        only: Literal["new", "existing"] | None = None,
    ) -> HostRecord:
        """Set one class's inventory. ``only="new"``: only if the host has none of that
        class yet (Placement's POST); ``"existing"``: only if it has (Placement's PUT of
        one class). Checked in the same transaction as the write."""
        parsed = Inventory.parse(inventory, f"inventories.{resource_class}")
        with self._store.write() as session:
            row = locked_host(session, ident, generation)
            current = inventories_of(session, row)
            if only == "new" and resource_class in current:
                raise Conflict(
                    f"Update conflict: host {row.name} already has a {resource_class} inventory",
                    field="resource_class",
                )
            if only == "existing" and resource_class not in current:
                raise ValidationError(
                    f"No inventory record with resource class {resource_class} for resource "
                    f"provider {row.uuid}",
                    field="resource_class",
                )
            current[resource_class] = parsed
            write_inventories(session, row, current)
            return self._bump(session, row)

    def delete_inventory(
        self, ident: str, resource_class: str, *, generation: int | None = None
    ) -> HostRecord:
        with self._store.write() as session:
            row = locked_host(session, ident, generation)
            current = inventories_of(session, row)
            if current.pop(resource_class, None) is None:
                raise NotFound(
                    f"No inventory of class {resource_class} found for delete (host {row.name})",
                    field=f"inventories.{resource_class}",
                )
            write_inventories(session, row, current)
            return self._bump(session, row)

    def set_traits(
        self, ident: str, traits: Iterable[str], *, generation: int | None = None
    ) -> HostRecord:
        """Replace the host's traits. As Placement, the same set again changes nothing and
        moves no generation, so a writer holding the generation it read does not lose."""
        names = [validate_trait_name(t, f"traits[{i}]") for i, t in enumerate(traits)]
        with self._store.write() as session:
            row = locked_host(session, ident, generation)
            if not self._write_traits(session, row, names):
                return self._record(session, row)
            return self._bump(session, row)

    def set_aggregates(
        self,
        ident: str,
        aggregates: Iterable[str],
        *,
        generation: int | None = None,
        bump: bool = True,
    ) -> HostRecord:
        """Replace the host's aggregates. ``bump=False``: its generation stays (Placement
        before 1.19, whose aggregate writes carry no generation); schedulers still learn
        of the change from the clock."""
        aggs = validate_aggregates(aggregates)
        with self._store.write() as session:
            row = locked_host(session, ident, generation)
            session.execute(delete(HostAggregateRow).where(HostAggregateRow.host_id == row.id))
            session.add_all(HostAggregateRow(host_id=row.id, aggregate=a) for a in aggs)
            if bump:
                return self._bump(session, row)
            session.flush()
            mark_changed(session, {row.id})
            return self._record(session, row)

    # -- helpers -----------------------------------------------------------------------
    def _bump(self, session: Session, row: HostRow, *, touch: Iterable[int] = ()) -> HostRecord:
        """Bump ``row``'s generation (compare-and-swap) and those of ``touch``."""
        bump_generations(session, {row.id: row.generation}, touch=touch)
        row.updated_at = now()
        session.flush()
        session.refresh(row)
        return self._record(session, row)

    def _write_traits(self, session: Session, row: HostRow, names: builtins.list[str]) -> bool:
        """Whether the host's trait set changed."""
        wanted = set(lookup.require_traits(session, names, "traits").values())
        held = set(
            session.scalars(select(HostTraitRow.trait_id).where(HostTraitRow.host_id == row.id))
        )
        if wanted == held:
            return False
        session.execute(delete(HostTraitRow).where(HostTraitRow.host_id == row.id))
        session.add_all(HostTraitRow(host_id=row.id, trait_id=t) for t in sorted(wanted))
        return True

    def _record(self, session: Session, row: HostRow) -> HostRecord:
        return self._records(session, [row])[0]

    def _records(self, session: Session, rows: builtins.list[HostRow]) -> builtins.list[HostRecord]:
        return host_records(session, rows)


# A batch this large changes the hosts' tables enough that PostgreSQL's planner, until
# autovacuum gets to them (a minute or more later), scans all hosts where an index finds
# the few it needs: the scheduler's per-call "providers changed since" read among them,
# ten times slower by sequential scan than by index.
BULK_LOAD = 1000

_BULK_FIELDS = frozenset({"name", "uuid", "state", "traits", "aggregates", "inventories"})
