"""From what a caller asks (``RequestSpec``s) to what the core decides on (``VmRequest``s):
the VMs, flavors, traits and server groups the requests name, read from the store in one
transaction. Bad requests raise, naming the field; a VM that cannot be placed now (wrong
state) becomes an item carrying its error, so the rest of the batch goes on."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy import bindparam, select

from loadmaster.cluster import lookup
from loadmaster.cluster.groups import group_record
from loadmaster.cluster.records import GroupRecord
from loadmaster.cluster.vm_rows import FlavorRules, vms_with_flavors
from loadmaster.cluster.vms import PLACED_STATES
from loadmaster.errors import InvalidTransition, LoadmasterError, NotFound, ValidationError
from loadmaster.resources import aggregate_specs, one_numa_node, pci_numa_affinity
from loadmaster.scheduler.core.request import RequestSpec, VmRequest
from loadmaster.scheduler.core.snapshot import Snapshot
from loadmaster.store import Prepared, Store, run_chunked
from loadmaster.store.locking import GROUP_COLUMNS, execute_core
from loadmaster.store.schema import (
    AllocationRow,
    FlavorRow,
    ResourceClassRow,
    ServerGroupRow,
    VmRow,
)
from loadmaster.store.transaction import Transaction, as_session

SCHEDULABLE_STATES = ("requested", "stopped", "running")


@dataclass
class Item:
    """One VM of the batch on its way through: where it was asked, and how it went."""

    position: int
    request: VmRequest
    error: LoadmasterError | None = None
    attempts: int = 0
    seconds: float = 0.0
    # Its call's intent (``Claim.intent``): calls of different intents may be decided
    # together (``coalesce.py``), each VM claimed with its own.
    intent: str | None = None


@dataclass
class Resolved:
    """A call's VMs, the server groups they belong to, and per hard-affinity group the
    hosts its members of the call are leaving (the group follows them there)."""

    items: list[Item]
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    leaving: dict[str, list[int]] = field(default_factory=dict)


def vm_count(spec: RequestSpec) -> int:
    """How many VMs ``spec`` places (a flavor request without a count: one)."""
    return spec.count if isinstance(spec.count, int) else len(spec.vms or ()) or 1


def check_size(requests: Sequence[RequestSpec], limit: int) -> None:
    total = 0
    for i, spec in enumerate(requests):
        if isinstance(spec, RequestSpec):
            total += vm_count(spec)
        if total > limit:
            raise ValidationError(
                f"requests[{i}]: one call places at most {limit} VMs in all "
                "(ask GET /capacity how many fit)",
                field=f"requests[{i}]",
            )


def resolve(
    store: Store,
    snap: Snapshot,
    requests: Sequence[RequestSpec],
    *,
    dry_run: bool,
    move_pending: bool = False,
    intent: str | None = None,
    session: Transaction | None = None,
) -> Resolved:
    """Every request resolved against the store (and the snapshot's host names).
    ``move_pending``: a pending VM may be placed again (a drain); ``intent`` ("start" or
    "migrate") refuses VMs in the other state. ``session``: a read transaction the caller
    has open, else one of its own."""
    if not requests:
        raise ValidationError("requests must name at least one VM to place", field="requests")
    for i, spec in enumerate(requests):
        if not isinstance(spec, RequestSpec):
            raise ValidationError(f"requests[{i}] must be a RequestSpec", field=f"requests[{i}]")
        spec.check(f"requests[{i}]")
        if spec.flavor is not None and not dry_run:
            raise ValidationError(
                f"requests[{i}].flavor: a flavor request has no VM to claim for; create the "
                "VMs first, or ask with dry_run (or capacity)",
                field=f"requests[{i}].flavor",
            )
    out = Resolved([])
    with store.read_transaction(session) as session:
        resolver = _Resolver(session, snap, out, move_pending, intent)
        for i, spec in enumerate(requests):
            resolver.one(spec, f"requests[{i}]")
        seen: set[str] = set()
        for item in out.items:
            vm = item.request.vm
            if vm is not None and vm in seen:
                raise ValidationError(f"vm {vm} appears twice in one call", field="requests")
            seen.add(vm or "")
        if out.groups:
            _count_group_sizes(session, out)
    return out


def _count_group_sizes(session: Transaction, out: Resolved) -> None:
    """Each request learns how many VMs its group holds once the call is done: the
    members placed now and those of the call (counted once if both)."""
    members: dict[str, set[str]] = {name: set() for name in out.groups}
    for name, uuid in execute_core(
        session,
        select(ServerGroupRow.name, VmRow.uuid)
        .join(VmRow, VmRow.group_id == ServerGroupRow.id)
        .where(ServerGroupRow.name.in_(members), VmRow.state.in_(PLACED_STATES)),
    ):
        members[name].add(uuid)
    for item in out.items:
        group = item.request.group
        if group is not None and item.error is None:
            members[group.name].add(item.request.vm or f"#{item.position}")
    for item in out.items:
        group = item.request.group
        if group is not None:
            item.request.group_size = len(members[group.name])


@dataclass
class _Resolver:
    session: Transaction
    snap: Snapshot
    out: Resolved
    move_pending: bool
    intent: str | None

    def one(self, spec: RequestSpec, where: str) -> None:
        session, snap = self.session, self.snap
        lookup.require_traits(session, spec.required_traits, f"{where}.required_traits")
        lookup.require_traits(session, spec.forbidden_traits, f"{where}.forbidden_traits")
        if spec.overrides:
            lookup.require_classes(session, spec.overrides, f"{where}.overrides")
        for attr in ("include_hosts", "exclude_hosts"):
            for j, host in enumerate(getattr(spec, attr) or ()):
                if host not in snap.index:
                    raise NotFound(
                        f"{where}.{attr}[{j}] {host!r}: no such host",
                        field=f"{where}.{attr}[{j}]",
                    )
        group = None
        if spec.group is not None:
            group = group_record(
                lookup.group_row(as_session(session), spec.group, f"{where}.group")
            )
            self.out.groups[group.name] = group
        base = VmRequest(
            vm=None,
            label="",
            flavor="",
            resources={},
            required_traits=frozenset(spec.required_traits),
            forbidden_traits=frozenset(spec.forbidden_traits),
            member_of=tuple(frozenset(m) for m in spec.member_of),
            forbidden_aggregates=frozenset(spec.forbidden_aggregates),
            group=group,
            include_hosts=None if spec.include_hosts is None else frozenset(spec.include_hosts),
            exclude_hosts=frozenset(spec.exclude_hosts),
        )
        items = self.out.items
        if spec.flavor is not None:
            flavor = lookup.flavor_row(as_session(session), spec.flavor, f"{where}.flavor")
            request = with_flavor(base, flavor, spec.overrides)
            items.extend(
                Item(
                    len(items) + n,
                    replace(request, label=f"{flavor.name}#{n}"),
                    intent=self.intent,
                )
                for n in range(spec.count or 1)
            )
        else:
            self._vms(spec, where, base)

    def _vms(self, spec: RequestSpec, where: str, base: VmRequest) -> None:
        session, snap, groups = self.session, self.snap, self.out.groups
        given = list(spec.vms)
        uuids = [lookup.canonical_uuid(u) for u in given]
        rows, flavors = vms_with_flavors(session, uuids, lock=False)
        # One VM per call is the common case: no query for groups none of them has.
        group_ids = {r.group_id for r in rows.values() if r.group_id}
        group_rows = {
            g.id: g for g in run_chunked(session, _GROUPS_BY_ID, "ids", sorted(group_ids))
        }
        position = len(self.out.items)
        movable = SCHEDULABLE_STATES + (("pending",) if self.move_pending else ())
        # VMs of one flavor, overrides and group share one request but for which VM they
        # are (a mass start's 10,000 VMs have a few dozen).
        shared: dict[tuple[object, ...], VmRequest] = {}
        names: dict[str, str] = {}

        def vm(uuid: str) -> str:
            """A refused VM by its name, read once for the call's VMs at the first refusal."""
            if not names:
                names.update(lookup.vm_names(session, uuids))
            return names.get(uuid, uuid)

        for j, uuid in enumerate(uuids):
            row = rows.get(uuid)
            if row is None:
                raise NotFound(
                    f"{where}.vms[{j}] {given[j]!r}: no such VM", field=f"{where}.vms[{j}]"
                )
            group = base.group
            if row.group_id is not None:
                own = group_record(group_rows[row.group_id])
                if group is not None and group.name != own.name:
                    raise ValidationError(
                        f"{where}.group {group.name!r}: VM {vm(uuid)} belongs to group {own.name}",
                        field=f"{where}.group",
                    )
                group = groups.setdefault(own.name, own)
            flavor = flavors.get(row.flavor_id) if row.flavor_id is not None else None
            key = (row.flavor_id, tuple(sorted(row.overrides.items())), group)
            if key not in shared:
                shared[key] = replace(
                    with_flavor(base, flavor, row.overrides) if flavor is not None else base,
                    group=group,
                )
            request = copy.copy(shared[key])
            request.vm = request.label = row.uuid
            error: LoadmasterError | None = None
            if row.state not in movable or flavor is None:
                error = InvalidTransition(
                    f"VM {vm(uuid)} is {row.state}; only a requested, stopped or running VM can be "
                    "placed",
                    field=f"{where}.vms[{j}]",
                )
            elif self.intent == "start" and row.state == "running":
                error = InvalidTransition(
                    f"VM {vm(uuid)} is already running on its host; to move it, migrate it",
                    field=f"{where}.vms[{j}]",
                )
            elif self.intent == "migrate" and row.state != "running":
                error = InvalidTransition(
                    f"VM {vm(uuid)} is {row.state}; only a running VM migrates",
                    field=f"{where}.vms[{j}]",
                )
            elif self.intent == "evacuate" and row.state not in ("running", "pending"):
                error = InvalidTransition(
                    f"VM {vm(uuid)} is {row.state}; only a running or pending VM is evacuated",
                    field=f"{where}.vms[{j}]",
                )
            elif row.state in ("running", "pending") and row.host_id is not None:
                # Scheduling a running VM is a live migration (a pending one is re-placed):
                # anywhere but where it is.
                current = int(snap.root_of[snap.row_of[row.host_id]])
                request.exclude_hosts = request.exclude_hosts | {snap.names[current]}
                if row.state == "running" and current in snap.sharing:
                    request.shared_held = _held_on_sharing(session, snap, row.consumer_id)
                if group is not None and group.policy == "affinity":
                    self.out.leaving.setdefault(group.name, []).append(current)
            self.out.items.append(Item(position + j, request, error, intent=self.intent))


def _held_on_sharing(
    session: Transaction, snap: Snapshot, consumer_id: int
) -> tuple[tuple[str, int], ...]:
    """What the consumer holds on the snapshot's sharing providers: (class, row)."""
    ids = [int(snap.provider_ids[r]) for r in snap.sharing_rows.tolist()]
    found = execute_core(
        session,
        select(AllocationRow.host_id, ResourceClassRow.name)
        .join(ResourceClassRow, ResourceClassRow.id == AllocationRow.resource_class_id)
        .where(AllocationRow.consumer_id == consumer_id, AllocationRow.host_id.in_(ids)),
    ).all()
    return tuple(sorted((name, snap.row_of[host_id]) for host_id, name in found))


def with_flavor(
    base: VmRequest, flavor: FlavorRow | FlavorRules, overrides: Mapping[str, int]
) -> VmRequest:
    member_of, forbidden_aggregates = aggregate_specs(flavor.extra_specs)
    affinity = pci_numa_affinity(flavor.extra_specs)
    return replace(
        base,
        flavor=flavor.name,
        resources=lookup.effective_resources(flavor.resources, overrides),
        required_traits=base.required_traits | frozenset(flavor.required_traits),
        forbidden_traits=base.forbidden_traits | frozenset(flavor.forbidden_traits),
        member_of=base.member_of + member_of,
        forbidden_aggregates=base.forbidden_aggregates | forbidden_aggregates,
        one_numa_node=one_numa_node(flavor.extra_specs) or affinity is not None,
        pci_numa_affinity=affinity,
        class_traits=tuple(
            sorted((name, frozenset(traits)) for name, traits in flavor.class_traits.items())
        )
        if flavor.class_traits
        else (),
    )


# A group's columns, not its entity: read for every call whose VMs are in groups.
_GROUPS_BY_ID = Prepared(
    select(*GROUP_COLUMNS).where(ServerGroupRow.id.in_(bindparam("ids", expanding=True)))
)
