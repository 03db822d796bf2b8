"""Resource classes, traits and flavors: the vocabulary hosts and VMs are described in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.images import image_row
from loadmaster.cluster.records import FlavorRecord
from loadmaster.errors import Conflict, NotFound, StoreUnavailable, ValidationError
from loadmaster.images import IMAGE_SPEC
from loadmaster.resources import (
    STANDARD_BY_NAME,
    STANDARD_CLASSES,
    STANDARD_TRAITS,
    UNKNOWN_SPECS,
    ResourceClass,
    UnknownSpecs,
    class_order,
    extra_spec_names,
    parse_flavor,
    validate_custom_name,
    validate_custom_trait,
)
from loadmaster.resources.aliases import ALIAS_SPEC, PciAlias, alias_requests
from loadmaster.resources.classes import validate_descriptor
from loadmaster.store import Store, again_on_write_conflict
from loadmaster.store.schema import (
    AllocationRow,
    FlavorRow,
    HostTraitRow,
    InventoryRow,
    ResourceClassRow,
    TraitRow,
    VmRow,
)


def sync_standard_vocabulary(store: Store) -> None:
    """Insert standard classes and traits this database does not have yet (new release, new
    names). Several processes start at once and sync the same names: each insert skips the
    names another one wrote (ON CONFLICT DO NOTHING), so none of them fails or gives up;
    and what is missing afterwards is an error, never a silent half-sync."""
    with store.write() as session:
        insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
        session.execute(
            insert(ResourceClassRow)
            .values(
                [
                    {
                        "name": rc.name,
                        "kind": rc.kind,
                        "unit": rc.unit,
                        "description": rc.description,
                    }
                    for rc in STANDARD_CLASSES
                ]
            )
            .on_conflict_do_nothing(index_elements=["name"])
        )
        session.execute(
            insert(TraitRow)
            .values([{"name": t} for t in sorted(STANDARD_TRAITS)])
            .on_conflict_do_nothing(index_elements=["name"])
        )
    with store.read() as session:
        classes = set(session.scalars(select(ResourceClassRow.name)))
        traits = set(session.scalars(select(TraitRow.name)))
    missing = sorted({rc.name for rc in STANDARD_CLASSES} - classes) + sorted(
        STANDARD_TRAITS - traits
    )
    if missing:
        raise StoreUnavailable(
            f"standard vocabulary could not be synced: {len(missing)} names missing "
            f"({', '.join(missing[:3])}...)"
        )


class ResourceClassService:
    def __init__(self, store: Store) -> None:
        self._store = store

    def list(self) -> list[ResourceClass]:
        with self._store.read() as session:
            # Custom classes in creation order (ids), after the standard ones.
            rows = sorted(
                session.scalars(select(ResourceClassRow).order_by(ResourceClassRow.id)),
                key=lambda r: class_order(r.name),
            )
            return [ResourceClass(r.name, r.kind, r.unit, r.description) for r in rows]

    def get(self, name: str) -> ResourceClass:
        with self._store.read() as session:
            row = session.scalar(select(ResourceClassRow).where(ResourceClassRow.name == name))
            if row is None:
                raise NotFound(f"No such resource class {name}.", field="name")
            return ResourceClass(row.name, row.kind, row.unit, row.description)

    def create(self, name: str, **fields: Any) -> ResourceClass:
        """Create a custom class (``put``'s fields); creating one that exists with the same
        fields is a no-op (PUT), unless ``exist_ok`` is false (POST: 409)."""
        return self.put(name, **fields)[0]

    def put(
        self,
        name: str,
        *,
        kind: str = "custom",
        unit: str = "unit",
        description: str = "",
        exist_ok: bool = True,
    ) -> tuple[ResourceClass, bool]:
        """``create``, and whether the class is new."""
        validate_custom_name(name)
        validate_descriptor(kind, "kind")
        validate_descriptor(unit, "unit")
        validate_descriptor(description, "description", allow_empty=True)
        wanted = ResourceClass(name, kind, unit, description)
        return again_on_write_conflict(lambda: self._create(wanted, exist_ok))

    def _create(self, wanted: ResourceClass, exist_ok: bool) -> tuple[ResourceClass, bool]:
        name, kind, unit, description = wanted.name, wanted.kind, wanted.unit, wanted.description
        with self._store.write() as session:
            row = session.scalar(select(ResourceClassRow).where(ResourceClassRow.name == name))
            if row is not None:
                if not exist_ok:
                    raise Conflict(
                        f"Conflicting resource class already exists: {name}", field="name"
                    )
                existing = ResourceClass(row.name, row.kind, row.unit, row.description)
                if existing != wanted:
                    raise Conflict(
                        f"resource class {name} already exists with other fields", field="name"
                    )
                return existing, False
            session.add(ResourceClassRow(name=name, kind=kind, unit=unit, description=description))
        return wanted, True

    def rename(self, name: str, new_name: str) -> ResourceClass:
        """Placement's update (microversions 1.2 to 1.6). Inventories and allocations refer
        to the class by id and follow; flavors and VM overrides name it in their JSON, so a
        class they name keeps its name (409) rather than leave them naming nothing."""
        if name in STANDARD_BY_NAME:
            raise ValidationError(f"Cannot update standard resource class {name}", field="name")
        validate_custom_name(new_name)
        with self._store.write() as session:
            row = session.scalar(
                select(ResourceClassRow).where(ResourceClassRow.name == name).with_for_update()
            )
            if row is None:
                raise NotFound(f"No such resource class {name}.", field="name")
            if new_name != name and session.scalar(
                select(ResourceClassRow.id).where(ResourceClassRow.name == new_name)
            ):
                raise Conflict(f"Resource class already exists: {new_name}", field="name")
            users = _flavors_using_class(session, name) or _vms_overriding_class(session, name)
            if users and new_name != name:
                raise Conflict(
                    f"resource class {name} is named by {users[0]} and keeps its name",
                    field="name",
                )
            row.name = new_name
            return ResourceClass(row.name, row.kind, row.unit, row.description)

    def delete(self, name: str) -> None:
        if name in STANDARD_BY_NAME:
            raise ValidationError(f"Cannot delete standard resource class {name}", field="name")
        with self._store.write() as session:
            # Locked first: a VM or flavor naming the class waits (see require_classes).
            row = session.scalar(
                select(ResourceClassRow).where(ResourceClassRow.name == name).with_for_update()
            )
            if row is None:
                raise NotFound(f"No such resource class {name}.", field="name")
            vms = _vms_overriding_class(session, name)
            if vms:
                raise Conflict(
                    f"resource class {name} is named in the overrides of VM {vms[0]} "
                    f"({len(vms)} VMs not deleted)",
                    field="name",
                )
            for table, what in ((InventoryRow, "inventories"), (AllocationRow, "allocations")):
                count = session.scalar(
                    select(func.count()).select_from(table).where(table.resource_class_id == row.id)
                )
                if count:
                    # Placement's words first: its clients look for them.
                    raise Conflict(
                        f"Error in delete resource class '{name}': Class is in use in "
                        f"{'inventory' if table is InventoryRow else 'allocations'} "
                        f"({count} {what})",
                        field="name",
                    )
            flavors = _flavors_using_class(session, name)
            if flavors:
                raise Conflict(
                    f"resource class {name} is in use by flavor {flavors[0]}", field="name"
                )
            session.delete(row)


def _vms_overriding_class(session: Session, name: str) -> list[str]:
    """VMs not deleted whose overrides name the class (even at 0: a claim reads it)."""
    return [
        uuid
        for uuid, overrides in session.execute(
            select(VmRow.uuid, VmRow.overrides).where(VmRow.state != "deleted").order_by(VmRow.id)
        )
        if name in overrides
    ]


def _flavors_using_class(session: Session, name: str) -> list[str]:
    return [
        f.name
        for f in session.scalars(select(FlavorRow).order_by(FlavorRow.name))
        if name in f.resources
    ]


class TraitService:
    def __init__(self, store: Store) -> None:
        self._store = store

    def list(
        self,
        *,
        names: Iterable[str] | None = None,
        prefix: str | None = None,
        associated: bool | None = None,
    ) -> list[str]:
        """Every trait, or those named, starting with ``prefix``, set (``associated``) or
        not set on some host, as Placement's ``GET /traits`` filters."""
        query = select(TraitRow.name).order_by(TraitRow.name)
        if names is not None:
            query = query.where(TraitRow.name.in_(list(names)))
        if prefix is not None:
            query = query.where(TraitRow.name.startswith(prefix, autoescape=True))
        if associated is not None:
            used = select(HostTraitRow.trait_id)
            query = query.where(TraitRow.id.in_(used) if associated else TraitRow.id.not_in(used))
        with self._store.read() as session:
            return list(session.scalars(query))

    def exists(self, name: str) -> bool:
        with self._store.read() as session:
            return session.scalar(select(TraitRow.id).where(TraitRow.name == name)) is not None

    def create(self, name: str) -> bool:
        """Idempotent, like Placement's PUT /traits/{name}; True if it was new."""
        validate_custom_trait(name, "name")

        def write() -> bool:
            with self._store.write() as session:
                if session.scalar(select(TraitRow.id).where(TraitRow.name == name)) is None:
                    session.add(TraitRow(name=name))
                    return True
            return False

        return again_on_write_conflict(write)

    def delete(self, name: str) -> None:
        if name in STANDARD_TRAITS:
            raise ValidationError(f"Cannot delete standard trait {name}.", field="name")
        with self._store.write() as session:
            row = session.scalar(select(TraitRow).where(TraitRow.name == name))
            if row is None:
                raise NotFound(f"No such trait(s): {name}.", field="name")
            if session.scalar(
                select(func.count())
                .select_from(HostTraitRow)
                .where(HostTraitRow.trait_id == row.id)
            ):
                raise Conflict(f"The trait {name} is in use by a resource provider.", field="name")
            session.delete(row)


class FlavorService:
    """``unknown_specs`` is the default for extra specs loadmaster does not know: refuse
    the flavor, or warn (see ``parse_flavor``); a server takes it from its settings."""

    def __init__(
        self,
        store: Store,
        unknown_specs: UnknownSpecs = "refuse",
        aliases: Mapping[str, PciAlias] | None = None,
    ) -> None:
        self._store = store
        # The server's PCI aliases (pci_passthrough:alias), by name.
        self.aliases: Mapping[str, PciAlias] = dict(aliases or {})
        if unknown_specs not in UNKNOWN_SPECS:
            raise ValidationError(
                f"unknown_specs must be refuse or warn, got {unknown_specs!r}",
                field="unknown_specs",
            )
        self.unknown_specs: UnknownSpecs = unknown_specs

    def create(
        self, definition: dict[str, object], *, unknown_specs: UnknownSpecs | None = None
    ) -> FlavorRecord:
        spec = parse_flavor(definition, unknown_specs or self.unknown_specs, self.aliases)
        with self._store.write() as session:
            for key, kind, name in extra_spec_names(spec.extra_specs):
                check = lookup.require_classes if kind == "class" else lookup.require_traits
                try:
                    check(session, [name], "extra_specs")
                except NotFound:
                    raise NotFound(
                        f"extra_specs.{key}: no such {'resource class' if kind == 'class' else kind}",
                        field=f"extra_specs.{key}",
                    ) from None
            if IMAGE_SPEC in spec.extra_specs:
                image_row(session, spec.extra_specs[IMAGE_SPEC], f"extra_specs.{IMAGE_SPEC}")
            where = f"extra_specs.{ALIAS_SPEC}"
            asked = spec.extra_specs.get(ALIAS_SPEC)
            for alias, _ in alias_requests(asked, self.aliases) if asked is not None else ():
                missing = (
                    []
                    if alias.resource_class in lookup.class_ids(session)
                    else [alias.resource_class]
                )
                missing += sorted(alias.traits - set(lookup.trait_ids(session, alias.traits)))
                if missing:
                    raise NotFound(
                        f"{where}: alias {alias.name} asks for {missing[0]}, which no host "
                        "offers (no such class or trait)",
                        field=where,
                    )
            lookup.require_classes(session, spec.resources, "resources", lock=True)
            lookup.require_traits(session, spec.required_traits, "required_traits")
            lookup.require_traits(session, spec.forbidden_traits, "forbidden_traits")
            if session.scalar(select(FlavorRow.id).where(FlavorRow.name == spec.name)) is not None:
                raise Conflict(f"flavor {spec.name} already exists", field="name")
            row = FlavorRow(
                name=spec.name,
                resources=dict(spec.resources),
                required_traits=sorted(spec.required_traits),
                forbidden_traits=sorted(spec.forbidden_traits),
                extra_specs=dict(spec.extra_specs),
                class_traits={c: sorted(t) for c, t in spec.class_traits.items()},
            )
            session.add(row)
            return replace(flavor_record(row), warnings=spec.warnings)

    def get(self, name: str) -> FlavorRecord:
        with self._store.read() as session:
            return flavor_record(lookup.flavor_row(session, name))

    def list(self) -> list[FlavorRecord]:
        with self._store.read() as session:
            return [
                flavor_record(r)
                for r in session.scalars(select(FlavorRow).order_by(FlavorRow.name))
            ]

    def delete(self, name: str) -> None:
        with self._store.write() as session:
            # Locked first, so a VM being created with this flavor (its foreign key holds
            # the row FOR KEY SHARE) commits before we count the users, or waits for us.
            row = lookup.flavor_row(session, name, lock=True)
            users = lookup.live_vms_using(session, VmRow.flavor_id, row.id)
            if users:
                raise Conflict(f"flavor {name} is used by {users} VMs", field="name")
            lookup.let_go_of(session, VmRow.flavor_id, row.id)
            session.delete(row)


def flavor_record(row: FlavorRow) -> FlavorRecord:
    return FlavorRecord(
        name=row.name,
        resources=dict(row.resources),
        required_traits=tuple(row.required_traits),
        forbidden_traits=tuple(row.forbidden_traits),
        extra_specs=dict(row.extra_specs),
        class_traits={c: tuple(t) for c, t in (row.class_traits or {}).items()},
    )
