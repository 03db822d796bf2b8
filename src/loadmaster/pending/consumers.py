"""Placement's allocation writes on generic consumers, in the one ledger.

A plain consumer (no VM) is Placement's: its records are replaced by what the client
writes, all ``active`` (Placement has no pending state: what it accepted is in use), and
it goes when it has none left. A VM's consumer keeps the VM's rules: writing through
Placement's API is a claim on the tree the providers belong to (capacity with pending
counted, the flavor's traits, server groups, the VM's state), so Placement writes and the
VM lifecycle never contradict each other. Every change moves the consumer's generation
and the generations of the providers written, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import delete, exists, insert, select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.errors import ConcurrentUpdate, Conflict, InsufficientCapacity, ValidationError
from loadmaster.pending import claims as claims_module
from loadmaster.pending import lifecycle
from loadmaster.pending.claims import Claim
from loadmaster.pending.trees import load_trees, with_roots
from loadmaster.store.locking import bump_generations, lock_hosts, lock_vms, mark_changed, now
from loadmaster.store.schema import AllocationRow, ConsumerRow, FlavorRow, HostRow, VmRow

# A consumer generation the client did not send at all (before microversion 1.28), as
# opposed to ``None``: "I expect this consumer to be new".
UNCHECKED = -1


@dataclass(frozen=True)
class ConsumerWrite:
    """What a client asks for one consumer: ``allocations`` maps provider uuid -> class ->
    amount (empty: remove them all)."""

    consumer: str
    allocations: Mapping[str, Mapping[str, int]]
    project_id: str
    user_id: str
    generation: int | None = UNCHECKED
    consumer_type: str | None = None


def write(session: Session, writes: Sequence[ConsumerWrite]) -> None:
    """All the consumers' new records, or none of them (the caller's transaction)."""
    touched = _Touched()
    if len(writes) > 1 and not lock_vms(session, [w.consumer for w in writes]):
        # Several plain consumers: their rows, then every host any of them touches, each
        # kind locked in one pass in id order, so two writes over crossing consumers or
        # hosts queue up instead of deadlocking. (A VM's write takes the claim's order.)
        held = lock_consumers(session, [w.consumer for w in writes])
        lock_hosts(session, with_roots(session, hosts_touched(session, writes, held)))
    for item in writes:
        # A VM's row first, then its consumer's: the lock order of every VM writer.
        vm = lock_vms(session, [item.consumer]).get(item.consumer)
        consumer = session.scalar(
            select(ConsumerRow).where(ConsumerRow.uuid == item.consumer).with_for_update()
        )
        # A consumer without records does not exist as far as Placement can tell (it
        # deletes such consumers): a VM that holds none is written as a new consumer.
        holds = consumer is not None and session.scalar(
            select(exists().where(AllocationRow.consumer_id == consumer.id))
        )
        _check_generation(consumer if holds else None, item)
        if vm is not None:
            _write_vm(session, vm, item)
        else:
            _write_plain(session, consumer, item, touched)
    # As Placement: the providers allocated from move on once per call, however many of
    # the consumers use them; those only freed do not.
    if touched.written:
        bump_generations(session, {}, touch=touched.written)
    if touched.changed:
        mark_changed(session, with_roots(session, touched.changed))


@dataclass
class _Touched:
    """The providers a call allocates from (``written``) and every one whose usage it
    changes, freed ones included (``changed``)."""

    written: set[int] = field(default_factory=set)
    changed: set[int] = field(default_factory=set)


def lock_consumers(session: Session, uuids: Sequence[str]) -> list[int]:
    """Lock these consumers' rows (those that exist) in id order; their ids."""
    return list(
        session.scalars(
            select(ConsumerRow.id)
            .where(ConsumerRow.uuid.in_(uuids))
            .order_by(ConsumerRow.id)
            .with_for_update()
        )
    )


def hosts_touched(
    session: Session, writes: Sequence[ConsumerWrite], consumer_ids: Sequence[int]
) -> set[int]:
    """The hosts the writes allocate from and those the consumers (ids) hold records on
    now; a provider that does not exist is left for the write to refuse."""
    uuids = {lookup.canonical_uuid(uuid) for w in writes for uuid in w.allocations}
    named = set(session.scalars(select(HostRow.id).where(HostRow.uuid.in_(uuids))))
    held = set(
        session.scalars(
            select(AllocationRow.host_id).where(AllocationRow.consumer_id.in_(consumer_ids))
        )
    )
    return named | held


def _check_generation(consumer: ConsumerRow | None, item: ConsumerWrite) -> None:
    if item.generation == UNCHECKED:
        return
    if consumer is None and item.generation is not None:
        raise ConcurrentUpdate(
            f"consumer generation conflict - expected null but got {item.generation}",
            field="consumer_generation",
        )
    if consumer is not None and item.generation != consumer.generation:
        given = "null" if item.generation is None else item.generation
        raise ConcurrentUpdate(
            f"consumer generation conflict - expected {consumer.generation} but got {given}",
            field="consumer_generation",
        )


def _write_plain(
    session: Session, consumer: ConsumerRow | None, item: ConsumerWrite, touched: _Touched
) -> None:
    stamp = now()
    old = (
        list(session.scalars(select(AllocationRow).where(AllocationRow.consumer_id == consumer.id)))
        if consumer is not None
        else []
    )
    if not item.allocations:
        if consumer is not None:
            session.delete(consumer)  # its records go with it (cascade)
            session.flush()
            # As Placement: freeing capacity moves no provider generation; schedulers
            # learn of it from the clock.
            touched.changed.update(r.host_id for r in old)
        return
    providers = _providers(session, item.allocations)
    class_ids = _classes(session, item.consumer, item.allocations)
    if consumer is None:
        consumer = ConsumerRow(
            uuid=item.consumer,
            project_id=item.project_id,
            user_id=item.user_id,
            # Written without a type (before 1.38): Placement's "unknown" type.
            consumer_type=item.consumer_type or "unknown",
            generation=0,
            created_at=stamp,
            updated_at=stamp,
        )
        session.add(consumer)
        session.flush()
    else:
        consumer.project_id, consumer.user_id = item.project_id, item.user_id
        if item.consumer_type is not None:
            consumer.consumer_type = item.consumer_type
    trees = load_trees(session, {p.root_id or p.id for p in providers.values()})
    mine = {(r.host_id, r.resource_class_id): r.amount for r in old}
    rows = []
    for uuid, amounts in item.allocations.items():
        provider = providers[uuid]
        tree = trees[provider.root_id or provider.id]
        for name, amount in amounts.items():
            class_id = class_ids[name]
            used = tree.used.get((provider.id, class_id), {})
            # What this consumer holds there now is replaced, so it does not count.
            held = mine.get((provider.id, class_id), 0)
            if held:
                tree.used[(provider.id, class_id)] = {
                    "active": used.get("active", 0) - held,
                    "pending": used.get("pending", 0),
                }
            if (provider.id, class_id) not in tree.inventories:
                raise InsufficientCapacity(
                    f"Unable to allocate inventory: Inventory for '{name}' on resource "
                    f"provider '{uuid}' invalid.",
                    field=f"allocations.{uuid}.resources.{name}",
                )
            problem = tree.problem(provider, name, class_id, amount)
            if problem:
                raise InsufficientCapacity(
                    f"Unable to allocate inventory: The requested amount would exceed the "
                    f"capacity. ({problem})",
                    field=f"allocations.{uuid}.resources.{name}",
                )
            rows.append(
                {
                    "consumer_id": consumer.id,
                    "host_id": provider.id,
                    "resource_class_id": class_id,
                    "amount": amount,
                    "state": "active",
                    "created_at": stamp,
                }
            )
    session.execute(delete(AllocationRow).where(AllocationRow.consumer_id == consumer.id))
    session.execute(insert(AllocationRow), rows)
    consumer.generation += 1
    consumer.updated_at = stamp
    session.flush()
    written = {p.id for p in providers.values()}
    touched.written |= written
    touched.changed |= {r.host_id for r in old} | written


def _classes(
    session: Session, consumer: str, allocations: Mapping[str, Mapping[str, int]]
) -> dict[str, int]:
    known = lookup.class_ids(session)
    for uuid, amounts in allocations.items():
        for name in amounts:
            if name not in known:
                # Placement's words: a class it cannot find fails the consumer, by name.
                raise ValidationError(
                    f"Unable to allocate inventory for consumer {consumer}: No such resource "
                    f"class {name}.",
                    field=f"allocations.{uuid}.resources.{name}",
                )
    return known


def _providers(session: Session, allocations: Mapping[str, object]) -> dict[str, HostRow]:
    found = {}
    for uuid in allocations:
        row = session.scalar(select(HostRow).where(HostRow.uuid == lookup.canonical_uuid(uuid)))
        if row is None:
            raise ValidationError(
                f"Allocation for resource provider '{uuid}' that does not exist.",
                field=f"allocations.{uuid}",
            )
        found[uuid] = row
    return found


def _write_vm(session: Session, vm: VmRow, item: ConsumerWrite) -> None:
    """A VM's allocations written through Placement's API: the VM's own rules decide."""
    if not item.allocations:
        lifecycle.release_row(session, vm, None)
        return
    providers = _providers(session, item.allocations)
    roots = {p.root_id or p.id for p in providers.values()}
    if len(roots) != 1:
        raise Conflict(
            f"VM {vm.uuid} runs on one host: its allocations must come from one provider tree",
            field="allocations",
        )
    root = session.get(HostRow, roots.pop())
    assert root is not None
    wanted: dict[str, int] = {}
    for amounts in item.allocations.values():
        for name, amount in amounts.items():
            wanted[name] = wanted.get(name, 0) + amount
    flavor = session.get(FlavorRow, vm.flavor_id) if vm.flavor_id is not None else None
    if flavor is None:
        raise Conflict(f"VM {vm.uuid} has no flavor left to claim by", field="allocations")
    if wanted != lookup.effective_resources(flavor.resources, vm.overrides):
        raise Conflict(
            f"VM {vm.uuid}'s allocations are its flavor's ({flavor.name}); Placement's API "
            "may move them, not resize them",
            field="allocations",
        )
    held_here = session.scalar(
        select(
            exists().where(
                AllocationRow.consumer_id == vm.consumer_id,
                AllocationRow.host_id.in_(select(HostRow.id).where(HostRow.root_id == root.id)),
            )
        )
    )
    if held_here and vm.state in ("running", "pending") and vm.host_id == root.id:
        return  # already there: nothing to change
    claims_module.claim(session, [Claim(vm.uuid, root.name, move=True)], True)
