"""Reading the ledger: records and usage, every total summed from the records when asked."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.records import AllocationRecord, ClassUsage
from loadmaster.errors import ValidationError
from loadmaster.store.schema import AllocationRow, ConsumerRow, HostRow, InventoryRow, VmRow


def allocations(
    session: Session, *, vm: str | None = None, host: str | None = None, state: str | None = None
) -> list[AllocationRecord]:
    query = (
        select(
            VmRow.uuid,
            HostRow.name,
            AllocationRow.resource_class_id,
            AllocationRow.amount,
            AllocationRow.state,
        )
        .join(VmRow, VmRow.consumer_id == AllocationRow.consumer_id)
        .join(HostRow, HostRow.id == AllocationRow.host_id)
        .order_by(AllocationRow.id)
    )
    if vm is not None:
        query = query.where(AllocationRow.consumer_id == lookup.vm_row(session, vm).consumer_id)
    if host is not None:
        query = query.where(AllocationRow.host_id == lookup.host_row(session, host).id)
    if state is not None:
        if state not in ("pending", "active"):
            raise ValidationError("state must be pending or active", field="state")
        query = query.where(AllocationRow.state == state)
    names = lookup.class_names(session)
    return [AllocationRecord(u, h, names[c], a, s) for u, h, c, a, s in session.execute(query)]


def usages(
    session: Session, hosts: Iterable[str] | None = None
) -> dict[str, dict[str, ClassUsage]]:
    """Per provider and class: capacity, active, pending — all summed from records now."""
    query = select(HostRow.id, HostRow.name)
    if hosts is not None:
        ids = [lookup.host_row(session, h).id for h in hosts]
        query = query.where(HostRow.id.in_(ids))
    names_by_id: dict[int, str] = dict(session.execute(query).all())
    class_names = lookup.class_names(session)
    sums = lookup.used_by_provider(session, names_by_id)
    result: dict[str, dict[str, ClassUsage]] = {name: {} for name in names_by_id.values()}
    inv_query = select(InventoryRow)
    if hosts is not None:
        inv_query = inv_query.where(InventoryRow.host_id.in_(names_by_id))
    for inv in session.scalars(inv_query):
        used = sums.get((inv.host_id, inv.resource_class_id), {})
        capacity = lookup.inventory_of(inv).capacity
        result[names_by_id[inv.host_id]][class_names[inv.resource_class_id]] = ClassUsage(
            capacity, used.get("active", 0), used.get("pending", 0)
        )
    return result


def pending_for_host(session: Session, host: str) -> dict[str, int]:
    return _sum_by_class(allocations(session, host=host, state="pending"))


def pending_for_vm(session: Session, vm: str) -> dict[str, dict[str, int]]:
    per_host: dict[str, dict[str, int]] = defaultdict(dict)
    for a in allocations(session, vm=vm, state="pending"):
        per_host[a.host][a.resource_class] = per_host[a.host].get(a.resource_class, 0) + a.amount
    return dict(per_host)


def project_usage(session: Session, project_id: str) -> dict[str, dict[str, int]]:
    """Per class, active and pending totals of one project's VMs (for quota)."""
    names = lookup.class_names(session)
    rows = session.execute(
        select(AllocationRow.resource_class_id, AllocationRow.state, AllocationRow.amount)
        .join(VmRow, VmRow.consumer_id == AllocationRow.consumer_id)
        .where(VmRow.project_id == project_id)
    )
    totals: dict[str, dict[str, int]] = {}
    for class_id, state, amount in rows:
        bucket = totals.setdefault(names[class_id], {"active": 0, "pending": 0})
        bucket[state] += amount
    return totals


def _sum_by_class(records: Iterable[AllocationRecord]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for r in records:
        totals[r.resource_class] = totals.get(r.resource_class, 0) + r.amount
    return totals


@dataclass(frozen=True)
class ConsumerView:
    """A consumer as Placement shows it: per provider uuid, its generation and amounts."""

    uuid: str
    project_id: str
    user_id: str
    consumer_type: str
    generation: int
    allocations: dict[str, dict[str, Any]]


def consumer(session: Session, uuid: str) -> ConsumerView | None:
    row = session.scalar(select(ConsumerRow).where(ConsumerRow.uuid == uuid))
    if row is None:
        return None
    names = lookup.class_names(session)
    by_provider: dict[str, dict[str, Any]] = {}
    for provider, generation, class_id, amount in session.execute(
        select(
            HostRow.uuid, HostRow.generation, AllocationRow.resource_class_id, AllocationRow.amount
        )
        .join(HostRow, HostRow.id == AllocationRow.host_id)
        .where(AllocationRow.consumer_id == row.id)
        .order_by(AllocationRow.id)
    ):
        entry = by_provider.setdefault(provider, {"generation": generation, "resources": {}})
        entry["resources"][names[class_id]] = amount
    return ConsumerView(
        row.uuid, row.project_id, row.user_id, row.consumer_type, row.generation, by_provider
    )


@dataclass(frozen=True)
class Holding:
    """What one consumer holds on one provider, with the consumer's generation."""

    consumer_generation: int
    resources: dict[str, int]


def provider_allocations(session: Session, provider: str) -> tuple[int, dict[str, Holding]]:
    """The provider's generation and, per consumer uuid, what it holds there."""
    host = lookup.host_row(session, provider)
    names = lookup.class_names(session)
    held: dict[str, Holding] = {}
    for uuid, generation, class_id, amount in session.execute(
        select(
            ConsumerRow.uuid,
            ConsumerRow.generation,
            AllocationRow.resource_class_id,
            AllocationRow.amount,
        )
        .join(ConsumerRow, ConsumerRow.id == AllocationRow.consumer_id)
        .where(AllocationRow.host_id == host.id)
        .order_by(AllocationRow.id)
    ):
        held.setdefault(uuid, Holding(generation, {})).resources[names[class_id]] = amount
    return host.generation, held


def consumer_usages(
    session: Session, project_id: str, user_id: str | None, consumer_type: str | None
) -> dict[str, dict[str, int]]:
    """Per consumer type, per class the amounts a project's (and user's) consumers hold,
    pending included, with ``consumer_count`` as Placement counts it."""
    names = lookup.class_names(session)
    query = (
        select(
            ConsumerRow.consumer_type,
            ConsumerRow.id,
            AllocationRow.resource_class_id,
            AllocationRow.amount,
        )
        .join(ConsumerRow, ConsumerRow.id == AllocationRow.consumer_id)
        .where(ConsumerRow.project_id == project_id)
    )
    if user_id is not None:
        query = query.where(ConsumerRow.user_id == user_id)
    if consumer_type is not None and consumer_type != "all":
        if consumer_type == "unknown":
            query = query.where(ConsumerRow.consumer_type == "unknown")
        else:
            query = query.where(ConsumerRow.consumer_type == consumer_type)
    totals: dict[str, dict[str, int]] = {}
    seen: dict[str, set[int]] = {}
    for kind, consumer_id, class_id, amount in session.execute(query):
        bucket = totals.setdefault(kind, {})
        bucket[names[class_id]] = bucket.get(names[class_id], 0) + amount
        seen.setdefault(kind, set()).add(consumer_id)
    for kind, ids in seen.items():
        totals[kind]["consumer_count"] = len(ids)
    return totals
