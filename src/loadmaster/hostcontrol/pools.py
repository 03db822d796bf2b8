"""Shared storage pools as Placement models them: one sharing provider per pool (trait
``MISC_SHARES_VIA_AGGREGATE``, its DISK_GB) in an aggregate with the hosts that mount it,
so the ledger counts the one storage once and not once per host.

A host's agent names the pool it mounts (the operator gives each host of the pool one
name); its registration creates the pool's provider, named so, with its trait, its
inventory and its aggregate in one write, or finds it, and puts the host in that aggregate.
The aggregate's uuid follows from the name, so hosts registering at the same moment agree
on it without reading each other's writes. A host that names no pool, or another one,
leaves the aggregates of the pools it was in; the pool's provider and what VMs hold of it
stay. Aggregates the operator gave the host, or the pool's provider, are kept."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import select

from loadmaster.cluster import HostRecord, HostService
from loadmaster.cluster.host_rows import parse_inventories
from loadmaster.errors import ConcurrentUpdate, Conflict, NotFound, ValidationError
from loadmaster.resources import Inventory
from loadmaster.resources.traits import SHARING_TRAIT
from loadmaster.store import Store, WriteConflict
from loadmaster.store.schema import HostAggregateRow, HostRow, HostTraitRow, TraitRow

# The namespace of the pools' aggregate uuids.
POOL_AGGREGATES = uuid.UUID("6f1c3d0e-5a0b-4c8e-9a55-2d6c1e0b7a41")
FIELD = "shared_pool.name"
# Compare-and-swap attempts of one aggregate change before the registration gives up.
ATTEMPTS = 5


def pool_aggregate(name: str) -> str:
    """The aggregate of the pool ``name`` and the hosts that mount it."""
    return str(uuid.uuid5(POOL_AGGREGATES, name))


@dataclass(frozen=True)
class SharedPool:
    name: str
    inventories: dict[str, Inventory]


def check_pool(
    hosts: HostService, host: str, spec: Mapping[str, object] | None
) -> SharedPool | None:
    """The pool a registration names, checked before anything is written: a name of its
    own (a provider of that name, if any, is a shared pool: a root with the trait), and
    its inventories."""
    if spec is None:
        return None
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValidationError(f"{FIELD} must be a name of 1 to 200 characters", field=FIELD)
    if name == host:
        raise ValidationError(f"{FIELD}: the pool needs a name other than its host's", field=FIELD)
    inventories = parse_inventories(spec.get("inventories", {}), "shared_pool.inventories")
    try:
        found: HostRecord | None = hosts.get(name)
    except NotFound:
        found = None
    if found is not None and (found.parent is not None or SHARING_TRAIT not in found.traits):
        raise Conflict(
            f"{FIELD}: provider {name} exists and is not a shared pool (a root provider "
            f"with trait {SHARING_TRAIT}); give the pool a name of its own",
            field=FIELD,
        )
    return SharedPool(name, inventories)


class PoolMembership:
    """Writes a registration's pool and the host's place in its aggregate."""

    def __init__(self, store: Store, hosts: HostService) -> None:
        self._store = store
        self._hosts = hosts

    def join(
        self,
        host: str,
        pool: SharedPool | None,
        set_inventories: Callable[[str, Mapping[str, Inventory]], object],
    ) -> None:
        """``set_inventories``: how the registration writes an existing provider's
        inventories (keeping a class that would fall below its allocations)."""
        joined: set[str] = set()
        if pool is not None:
            aggregate = pool_aggregate(pool.name)
            joined.add(aggregate)
            try:
                self._hosts.create(
                    pool.name,
                    traits=[SHARING_TRAIT],
                    aggregates=[aggregate],
                    inventories={k: v.as_dict() for k, v in pool.inventories.items()},
                )
            except Conflict:
                # Made before, or by a host of the pool registering at the same moment
                self._set_inventories(pool, set_inventories)
                self._change_aggregates(pool.name, lambda aggs: aggs | {aggregate})
        left = self._pool_aggregates(host) - joined
        self._change_aggregates(host, lambda aggs: (aggs - left) | joined)

    def _set_inventories(
        self,
        pool: SharedPool,
        set_inventories: Callable[[str, Mapping[str, Inventory]], object],
    ) -> None:
        """The pool's inventories as its hosts say, written only when they differ: the
        hosts of a pool registering together race for the same rows, and a write that
        lost one is read again."""
        wanted = {k: v.as_dict() for k, v in pool.inventories.items()}
        for attempt in range(ATTEMPTS):
            current = self._hosts.get(pool.name).inventories
            if {k: v.as_dict() for k, v in current.items()} == wanted:
                return
            try:
                set_inventories(pool.name, pool.inventories)
                return
            except WriteConflict:
                if attempt == ATTEMPTS - 1:
                    raise

    def _pool_aggregates(self, host: str) -> set[str]:
        """The aggregates of the host that are pools' (a sharing provider's, with the
        uuid of its name)."""
        with self._store.read() as session:
            mine = select(HostAggregateRow.aggregate).join(HostRow).where(HostRow.name == host)
            rows = session.execute(
                select(HostRow.name, HostAggregateRow.aggregate)
                .join(HostAggregateRow, HostAggregateRow.host_id == HostRow.id)
                .join(HostTraitRow, HostTraitRow.host_id == HostRow.id)
                .join(TraitRow, TraitRow.id == HostTraitRow.trait_id)
                .where(TraitRow.name == SHARING_TRAIT, HostAggregateRow.aggregate.in_(mine))
            ).all()
        return {aggregate for name, aggregate in rows if aggregate == pool_aggregate(name)}

    def _change_aggregates(self, name: str, change: Callable[[set[str]], set[str]]) -> None:
        for _ in range(ATTEMPTS):
            record = self._hosts.get(name)
            now = set(record.aggregates)
            wanted = change(now)
            if wanted == now:
                return
            try:
                self._hosts.set_aggregates(name, sorted(wanted), generation=record.generation)
                return
            except ConcurrentUpdate:
                continue
        raise ConcurrentUpdate(
            f"provider {name} kept changing; register again", field="shared_pool"
        )
