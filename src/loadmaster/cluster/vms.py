"""VMs (consumers): what they need, their tags, and the lifecycle they may follow."""

from __future__ import annotations

import builtins
import json
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import ConfigDict, Field, Strict, with_config
from sqlalchemy import String, bindparam, cast, exists, insert, or_, select
from sqlalchemy.orm import Session, aliased

from loadmaster import shapes
from loadmaster.cluster import lookup
from loadmaster.cluster.records import Nic, VmEvent, VmRecord
from loadmaster.cluster.vm_rows import VmState
from loadmaster.errors import Conflict, InvalidTransition, NotFound, ValidationError
from loadmaster.images import (
    DEFAULT_NETWORK,
    GIB,
    IMAGE_SPEC,
    NETWORK_SPEC,
    check_image_name,
    check_name,
    new_mac,
)
from loadmaster.resources import parse_amounts
from loadmaster.shapes import Amount, Name
from loadmaster.store import (
    Prepared,
    Store,
    again_on_write_conflict,
    pipelined,
    run,
    run_chunked,
    run_many,
)
from loadmaster.store.chunks import in_chunks
from loadmaster.store.locking import execute_core, now, touch_generations
from loadmaster.store.schema import (
    ConsumerRow,
    FlavorRow,
    HostRow,
    ImageRow,
    ServerGroupRow,
    VmEventRow,
    VmRow,
)
from loadmaster.tiers import parse_priority, tiers_in

# requested -> pending on a host -> running -> stopped/deleted; migrating = active on the
# source plus pending on the destination. A pending VM that fails to start goes back to
# requested, so it can be scheduled again.
TRANSITIONS: Mapping[str, frozenset[str]] = {
    "requested": frozenset({"pending", "deleted"}),
    "pending": frozenset({"running", "requested", "stopped", "deleted"}),
    "running": frozenset({"migrating", "stopped", "deleted"}),
    # To pending: its source died mid-migration and the destination launches it.
    "migrating": frozenset({"running", "pending", "stopped", "deleted"}),
    "stopped": frozenset({"pending", "deleted"}),
    "deleted": frozenset(),
}
VM_STATES = tuple(TRANSITIONS)
# A VM counts on a host (for VM counts and server groups) while it is headed there or runs
# there: pending VMs count exactly like running ones.
PLACED_STATES = ("pending", "running", "migrating")
Tag = Annotated[str, Strict(), Field(min_length=1, max_length=64)]


def move(row: VmRow | VmState, target: str) -> None:
    """Apply a lifecycle transition or refuse it, naming both states."""
    if target not in TRANSITIONS[row.state]:
        raise InvalidTransition(
            f"VM {row.uuid} cannot go from {row.state} to {target}", field="state"
        )
    row.state = target
    row.generation += 1
    row.updated_at = now()


def _tags(tags: Iterable[object]) -> list[str]:
    if isinstance(tags, str):
        raise ValidationError("tags must be a list of strings", field="tags")
    result = []
    for i, tag in enumerate(tags):
        if not isinstance(tag, str) or not tag or len(tag) > 64:
            raise ValidationError(
                f"tags[{i}] must be a non-empty string of at most 64 characters", field=f"tags[{i}]"
            )
        try:
            parse_priority(tag)
        except ValueError as exc:
            raise ValidationError(str(exc), field=f"tags[{i}]") from None
        result.append(tag)
    tiers = tiers_in(result)
    if len(tiers) > 1:
        names = ", ".join(t.name for t in tiers)
        raise ValidationError(f"tags name more than one SLA tier: {names}", field="tags")
    if len({t for t in result if parse_priority(t) is not None}) > 1:
        raise ValidationError("tags name more than one priority", field="tags")
    return sorted(set(result))


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class VmSpec:
    """A VM to create (``POST /vms`` takes it as it is); checked before any row is written."""

    name: Name
    flavor: Name
    project_id: Name = "default"
    user_id: Name = "default"
    overrides: Mapping[str, Amount] = field(default_factory=dict)
    tags: Sequence[Tag] = ()
    group: Name | None = None
    uuid: Name | None = None
    # Its disk's base image and its NIC's network; None: its flavor's (lm:image,
    # lm:network), else no image (a blank disk) and the network "default".
    image: Name | None = None
    network: Name | None = None


class VmService:
    def __init__(self, store: Store) -> None:
        self._store = store

    def create(self, name: str, flavor: str, **kwargs: object) -> VmRecord:
        return self.create_many([VmSpec(name, flavor, **kwargs)])[0]  # type: ignore[arg-type]

    def create_many(self, specs: Sequence[VmSpec]) -> list[VmRecord]:
        """Create VMs in one transaction: all of them or, on any bad spec, none.

        A client-chosen uuid makes the create safe to retry: a VM that already exists with
        exactly the fields asked for is answered as if created now (the first attempt landed
        and its answer was lost); one that differs is a Conflict naming the field."""
        checked = [
            self._check(spec, f"vms[{i}]" if len(specs) > 1 else "") for i, spec in enumerate(specs)
        ]
        return again_on_write_conflict(lambda: self._create_many(checked, len(specs)))

    def _create_many(
        self,
        checked: builtins.list[tuple[VmSpec, dict[str, int], builtins.list[str], str]],
        count: int,
    ) -> builtins.list[VmRecord]:
        # Core statements on the driver, no ORM entity: on SQLite this transaction holds
        # the one write turn a start's claim waits for (POST /vms then /start).
        with self._store.write() as session:
            stamp = now()
            flavors = _flavors(session, {spec.flavor for spec, *_ in checked})
            groups = _groups(session, {spec.group for spec, *_ in checked if spec.group})
            images = _images(session, checked, flavors)
            known: dict[str, int] | None = None
            wanted: builtins.list[dict[str, Any]] = []
            records: builtins.list[VmRecord] = []
            for (spec, overrides, tags, vm_uuid), prefix in zip(
                checked, _prefixes(count), strict=True
            ):
                flavor = flavors.get(spec.flavor)
                if flavor is None:
                    raise lookup.no_such_flavor(spec.flavor, f"{prefix}flavor")
                if overrides:
                    known = lookup.require_classes(
                        session, overrides, prefix + "overrides", lock=True, known=known
                    )
                resources = lookup.effective_resources(flavor.resources, overrides)
                if not resources:
                    # Such a VM holds no records: nothing would ever end its claim.
                    raise ValidationError(
                        f"{prefix}overrides: flavor {flavor.name} with these overrides asks "
                        "for no resource at all",
                        field=f"{prefix}overrides",
                    )
                group = None
                if spec.group is not None:
                    group = groups.get(spec.group)
                    if group is None:
                        raise lookup.no_such_group(spec.group, f"{prefix}group")
                image, image_bytes = _image_of(spec, flavor, resources, images, prefix)
                nics = [{"network": _network_of(spec, flavor), "mac": new_mac()}]
                wanted.append(
                    {
                        "uuid": vm_uuid,
                        "consumer_uuid": vm_uuid,
                        "name": spec.name,
                        "project_id": spec.project_id,
                        "user_id": spec.user_id,
                        "flavor_id": flavor.id,
                        "overrides": overrides,
                        "tags": tags,
                        "state": "requested",
                        "group_id": group.id if group is not None else None,
                        "generation": 0,
                        "tried_hosts": [],
                        "created_at": stamp,
                        "updated_at": stamp,
                        "image": image,
                        "nics": nics,
                    }
                )
                records.append(
                    VmRecord(
                        uuid=vm_uuid,
                        name=spec.name,
                        project_id=spec.project_id,
                        user_id=spec.user_id,
                        flavor=flavor.name,
                        overrides=dict(overrides),
                        tags=tuple(tags),
                        state="requested",
                        host=None,
                        target_host=None,
                        group=group.name if group is not None else None,
                        resources=resources,
                        required_traits=tuple(flavor.required_traits or ()),
                        forbidden_traits=tuple(flavor.forbidden_traits or ()),
                        generation=0,
                        created_at=stamp,
                        updated_at=stamp,
                        image=image,
                        nics=tuple(Nic(**n) for n in nics),
                        image_bytes=image_bytes,
                    )
                )
            uuids = [w["uuid"] for w in wanted]
            if len(set(uuids)) != len(uuids):
                raise Conflict("the same VM uuid appears twice in one request", field="uuid")
            existing: dict[str, Any] = {}
            existing.update((r.uuid, r) for r in run_chunked(session, _EXISTING, "uuids", uuids))
            for i, (row, prefix) in enumerate(zip(wanted, _prefixes(count), strict=True)):
                if row["uuid"] in existing:
                    _same_vm(existing[row["uuid"]], row, prefix)
                    records[i] = _record(existing[row["uuid"]])
            _insert(session, [w for w in wanted if w["uuid"] not in existing])
            return records

    def get(self, ident: str) -> VmRecord:
        uuid = lookup.vm_uuid(ident)
        with self._store.read() as session:
            row = run(session, _RECORD_OF, {"uuid": uuid}).first()
        if row is None:
            raise NotFound(f"vm {ident!r}: no such VM", field="vm")
        return _record(row)

    def list(
        self,
        *,
        state: str | None = None,
        host: str | None = None,
        project_id: str | None = None,
        group: str | None = None,
        include_deleted: bool = False,
        name: str | None = None,
        tag: str | None = None,
        incoming: bool = False,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[VmRecord]:
        """Oldest first. ``incoming`` also lists the VMs migrating to ``host``; ``limit``
        and ``offset`` page through the rest."""
        with self._store.read() as session:
            query = _RECORDS.order_by(VmRow.id)
            if state is not None:
                if state not in VM_STATES:
                    raise ValidationError(
                        f"state must be one of {', '.join(VM_STATES)}", field="state"
                    )
                query = query.where(VmRow.state == state)
            elif not include_deleted:
                query = query.where(VmRow.state != "deleted")
            if host is not None:
                host_id = lookup.host_row(session, host).id
                here = VmRow.host_id == host_id
                query = query.where(
                    or_(here, VmRow.target_host_id == host_id) if incoming else here
                )
            if project_id is not None:
                query = query.where(VmRow.project_id == project_id)
            if group is not None:
                query = query.where(VmRow.group_id == lookup.group_row(session, group).id)
            if name is not None:
                query = query.where(VmRow.name == name)
            if tag is not None:
                # Tags are a JSON list kept as json.dumps wrote it on both backends, so the
                # tag's own JSON form matches one whole element and nothing inside another.
                needle = json.dumps(tag)
                query = query.where(cast(VmRow.tags, String).contains(needle, autoescape=True))
            if offset < 0 or (limit is not None and limit < 0):
                raise ValidationError("limit and offset must be at least 0", field="limit")
            query = query.offset(offset).limit(limit)
            return [_record(row) for row in execute_core(session, query)]

    def events(self, *, vm: str | None = None, after: int = 0) -> builtins.list[VmEvent]:
        """The changes of VMs' states, hosts and migration targets in the order they were
        written (of one VM, by its uuid, if given); ``after``: only those past that
        event id, so a reader can follow the history as it grows."""
        with self._store.read() as session:
            query = (
                select(VmEventRow, VmRow.uuid, VmRow.name)
                .join(VmRow, VmRow.id == VmEventRow.vm_id)
                .where(VmEventRow.id > after)
                .order_by(VmEventRow.id)
            )
            if vm is not None:
                query = query.where(VmEventRow.vm_id == lookup.vm_row(session, vm).id)
            return [
                VmEvent(
                    e.id,
                    e.at,
                    uuid,
                    name,
                    e.old_state,
                    e.state,
                    e.old_host,
                    e.host,
                    e.old_target,
                    e.target,
                    e.fault,
                )
                for e, uuid, name in session.execute(query)
            ]

    def set_tags(self, ident: str, tags: Iterable[str]) -> VmRecord:
        clean = _tags(tags)
        with self._store.write() as session:
            row = lookup.vm_row(session, ident, lock=True)
            row.tags = clean
            row.generation += 1
            row.updated_at = now()
            session.flush()
            # The hosts' agents watch their host's generation: a bump is how the new tags
            # reach the guest's metadata, and so its SLA policy, within a cycle.
            touch_generations(session, {h for h in (row.host_id, row.target_host_id) if h})
            return vm_records(session, [row])[0]

    def _check(
        self, spec: VmSpec, prefix: str
    ) -> tuple[VmSpec, dict[str, int], builtins.list[str], str]:
        shapes.check(spec, prefix)
        dot = prefix + "." if prefix else ""
        if spec.image is not None:
            check_image_name(spec.image, f"{dot}image")
        if spec.network is not None:
            check_name(spec.network, "a network", f"{dot}network")
        if not spec.name.strip():
            raise ValidationError(f"{dot}name must not be blank", field=f"{dot}name")
        overrides = parse_amounts(spec.overrides, f"{dot}overrides")
        try:
            tags = _tags(spec.tags)
        except ValidationError as exc:
            raise ValidationError(exc.detail, field=f"{dot}{exc.field}") from None
        vm_uuid = spec.uuid or str(uuidlib.uuid4())
        try:
            vm_uuid = str(uuidlib.UUID(vm_uuid))
        except ValueError:
            raise ValidationError(
                f"{dot}uuid {spec.uuid!r} is not a UUID", field=f"{dot}uuid"
            ) from None
        return spec, overrides, tags, vm_uuid


# What a client chooses when it creates a VM: a retry must repeat all of it.
_CHOSEN = (
    "name",
    "project_id",
    "user_id",
    "flavor_id",
    "overrides",
    "tags",
    "group_id",
    "image",
    "networks",
)


def _same_vm(existing: Any, wanted: Mapping[str, Any], prefix: str) -> None:
    """Refuse a create whose uuid is taken by a VM with other fields (the MACs, made up
    anew by each attempt, aside)."""
    have = {a: getattr(existing, a) for a in _CHOSEN if a != "networks"}
    have["networks"] = [n["network"] for n in existing.nics or ()]
    want = {**wanted, "networks": [n["network"] for n in wanted["nics"]]}
    for attr in _CHOSEN:
        if have[attr] != want[attr]:
            shown = {"flavor_id": "flavor", "group_id": "group"}.get(attr, attr)
            raise Conflict(
                f"{prefix}uuid {wanted['uuid']} is already used by a VM with another {shown}",
                field=f"{prefix}uuid",
            )


def _prefixes(count: int) -> list[str]:
    return [f"vms[{i}]." if count > 1 else "" for i in range(count)]


def _flavors(session: Session, names: Iterable[str]) -> dict[str, Any]:
    """The flavors of these names, by name (those that exist)."""
    found: dict[str, Any] = {}
    for chunk in in_chunks(sorted(names)):
        found.update((r.name, r) for r in run(session, _FLAVORS, {"names": chunk}))
    return found


def _images(
    session: Session, checked: Iterable[tuple[VmSpec, Any, Any, Any]], flavors: Mapping[str, Any]
) -> dict[str, int]:
    """The sizes of the registered images these VMs name (or their flavors), by name."""
    names = {spec.image for spec, *_ in checked if spec.image}
    names |= {
        f.extra_specs[IMAGE_SPEC] for f in flavors.values() if IMAGE_SPEC in (f.extra_specs or {})
    }
    found: dict[str, int] = {}
    for chunk in in_chunks(sorted(names)):
        found.update((r.name, r.size_bytes) for r in run(session, _IMAGES, {"names": chunk}))
    return found


def _image_of(
    spec: VmSpec,
    flavor: Any,
    resources: Mapping[str, int],
    images: Mapping[str, int],
    prefix: str,
) -> tuple[str | None, int | None]:
    """The VM's image (its own, else its flavor's) and its size, refused when nobody
    registered it or the VM's DISK_GB cannot hold it."""
    if spec.image is not None:
        name, field, whose = spec.image, f"{prefix}image", ""
    elif IMAGE_SPEC in (flavor.extra_specs or {}):
        name = flavor.extra_specs[IMAGE_SPEC]
        field, whose = f"{prefix}flavor", f" (flavor {flavor.name}'s extra spec {IMAGE_SPEC})"
    else:
        return None, None
    size = images.get(name)
    if size is None:
        raise NotFound(
            f"{field}: no such image {name!r}{whose}; register it first (PUT /images/{name})",
            field=field,
        )
    disk_gb = resources.get("DISK_GB")
    if disk_gb and size > disk_gb * GIB:
        raise ValidationError(
            f"{field}: image {name!r}{whose} is {size} bytes, more than the VM's DISK_GB of "
            f"{disk_gb} ({disk_gb * GIB} bytes) can hold",
            field=field,
        )
    return name, size


def _network_of(spec: VmSpec, flavor: Any) -> str:
    return spec.network or (flavor.extra_specs or {}).get(NETWORK_SPEC) or DEFAULT_NETWORK


def _groups(session: Session, idents: Iterable[str]) -> dict[str, Any]:
    """The server groups these idents name, by ident: a uuid, else a name."""
    idents = sorted(set(idents))
    by_uuid: dict[str, Any] = {}
    by_name: dict[str, Any] = {}
    for chunk in in_chunks(idents):
        params = {"uuids": [lookup.canonical_uuid(i) for i in chunk], "names": chunk}
        for row in run(session, _GROUPS, params):
            by_uuid[row.uuid], by_name[row.name] = row, row
    found: dict[str, Any] = {}
    for ident in idents:
        row = by_uuid.get(lookup.canonical_uuid(ident)) or by_name.get(ident)
        if row is not None:
            found[ident] = row
    return found


def _insert(session: Session, vms: list[dict[str, Any]]) -> None:
    """Each new VM is the consumer of its uuid; a uuid a Placement client already uses
    for a plain consumer is refused (one consumer is not both)."""
    for chunk in in_chunks([vm["uuid"] for vm in vms]):
        # A VM's own consumer is not "taken": a twin create committed meanwhile, and the
        # insert below fails on it and the whole create is read again.
        taken = run(session, _TAKEN, {"uuids": chunk}).first()
        if taken is not None:
            raise Conflict(
                f"uuid {taken.uuid} is already a consumer of allocations written through "
                "Placement's API; a VM needs a uuid of its own",
                field="uuid",
            )
    consumers = [
        {
            "uuid": vm["uuid"],
            "project_id": vm["project_id"],
            "user_id": vm["user_id"],
            "consumer_type": "INSTANCE",
            "generation": 0,
            "created_at": vm["created_at"],
            "updated_at": vm["updated_at"],
        }
        for vm in vms
    ]
    # Two statements however many VMs: each VM's row finds its consumer's id by the uuid
    # (unique, indexed), as an executemany returns no ids to pass on.
    with pipelined(session):
        run_many(session, _INSERT_CONSUMERS, consumers)
        run_many(session, _INSERT_VMS, vms)


def vm_records(session: Session, rows: list[VmRow]) -> list[VmRecord]:
    """The records of these (loaded, perhaps just changed) VM rows, as committed now."""
    ids = [r.id for r in rows]
    found: dict[int, VmRecord] = {}
    for chunk in in_chunks(ids):
        for row in run(session, _RECORDS_BY_ID, {"ids": chunk}):
            found[row.id] = _record(row)
    return [found[i] for i in ids]


def _record(row: Any) -> VmRecord:
    """A row of ``_RECORDS``."""
    resources = row.flavor_resources if row.flavor is not None else {}
    return VmRecord(
        uuid=row.uuid,
        name=row.name,
        project_id=row.project_id,
        user_id=row.user_id,
        flavor=row.flavor,
        overrides=dict(row.overrides),
        tags=tuple(row.tags),
        state=row.state,
        host=row.host,
        target_host=row.target_host,
        group=row.group,
        resources=lookup.effective_resources(resources, row.overrides),
        required_traits=tuple(row.required_traits or ()),
        forbidden_traits=tuple(row.forbidden_traits or ()),
        generation=row.generation,
        created_at=row.created_at,
        updated_at=row.updated_at,
        fault=row.fault,
        host_seq=row.host_seq,
        tried_hosts=tuple(row.tried_hosts or ()),
        image=row.image,
        nics=tuple(Nic(str(n["network"]), str(n["mac"])) for n in row.nics or ()),
        image_bytes=row.image_bytes,
    )


_HOST = aliased(HostRow)
_TARGET = aliased(HostRow)
# A VM's record in one statement: its flavor's, hosts' and group's names joined, rather
# than a query for each (a VM's answer is on the operator's path: POST /vms/{uuid}/start).
_RECORDS = (
    select(
        VmRow.id,
        VmRow.uuid,
        VmRow.name,
        VmRow.project_id,
        VmRow.user_id,
        VmRow.overrides,
        VmRow.tags,
        VmRow.state,
        VmRow.generation,
        VmRow.created_at,
        VmRow.updated_at,
        VmRow.fault,
        VmRow.host_seq,
        VmRow.tried_hosts,
        VmRow.image,
        VmRow.nics,
        ImageRow.size_bytes.label("image_bytes"),
        FlavorRow.name.label("flavor"),
        FlavorRow.resources.label("flavor_resources"),
        FlavorRow.required_traits,
        FlavorRow.forbidden_traits,
        _HOST.name.label("host"),
        _TARGET.name.label("target_host"),
        ServerGroupRow.name.label("group"),
    )
    .outerjoin(FlavorRow, FlavorRow.id == VmRow.flavor_id)
    .outerjoin(_HOST, _HOST.id == VmRow.host_id)
    .outerjoin(_TARGET, _TARGET.id == VmRow.target_host_id)
    .outerjoin(ServerGroupRow, ServerGroupRow.id == VmRow.group_id)
    .outerjoin(ImageRow, ImageRow.name == VmRow.image)
)

# On the operator's path (the answer of a start or a migration): on the driver's cursor.
_RECORD_OF = Prepared(_RECORDS.where(VmRow.uuid == bindparam("uuid")))
_RECORDS_BY_ID = Prepared(_RECORDS.where(VmRow.id.in_(bindparam("ids", expanding=True))))

# A retry's VM: its record, and what its client chose (``_CHOSEN``) to compare.
_EXISTING = Prepared(
    _RECORDS.add_columns(VmRow.flavor_id, VmRow.group_id).where(
        VmRow.uuid.in_(bindparam("uuids", expanding=True))
    )
)
_FLAVORS = Prepared(
    select(
        FlavorRow.id,
        FlavorRow.name,
        FlavorRow.resources,
        FlavorRow.required_traits,
        FlavorRow.forbidden_traits,
        FlavorRow.extra_specs,
    ).where(FlavorRow.name.in_(bindparam("names", expanding=True)))
)
_IMAGES = Prepared(
    select(ImageRow.name, ImageRow.size_bytes).where(
        ImageRow.name.in_(bindparam("names", expanding=True))
    )
)
_GROUPS = Prepared(
    select(ServerGroupRow.id, ServerGroupRow.uuid, ServerGroupRow.name).where(
        ServerGroupRow.uuid.in_(bindparam("uuids", expanding=True))
        | ServerGroupRow.name.in_(bindparam("names", expanding=True))
    )
)
_CONSUMERS = ConsumerRow.metadata.tables["consumers"]
_VMS = VmRow.metadata.tables["vms"]
_TAKEN = Prepared(
    select(_CONSUMERS.c.uuid).where(
        _CONSUMERS.c.uuid.in_(bindparam("uuids", expanding=True)),
        ~exists().where(_VMS.c.consumer_id == _CONSUMERS.c.id),
    )
)
_INSERT_CONSUMERS = Prepared(insert(_CONSUMERS))
_INSERT_VMS = Prepared(
    insert(_VMS).values(
        consumer_id=select(_CONSUMERS.c.id)
        .where(_CONSUMERS.c.uuid == bindparam("consumer_uuid"))
        .scalar_subquery()
    )
)
