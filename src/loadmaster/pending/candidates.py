"""Placement's allocation candidates: where a request's amounts could be allocated now,
each candidate a set of providers (one host's tree, plus sharing providers that host
reaches through an aggregate), with pending claims counted as used.

Each tree places every class by the tree-fit rule (``resources/tree_fit.py``), the same
one claims follow, with the sharing providers after the tree's own: a class the tree
offers comes from the tree, one it lacks from a sharing provider. Hosts that are not
``up`` offer nothing: loadmaster places nothing new on them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.resources import Inventory
from loadmaster.resources.tree_fit import fit_in_tree
from loadmaster.store.schema import (
    AllocationRow,
    HostAggregateRow,
    HostRow,
    HostTraitRow,
    TraitRow,
)

SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"


@dataclass
class Provider:
    id: int
    uuid: str
    root_id: int
    parent_uuid: str | None
    up: bool
    inventories: dict[str, Inventory] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    traits: set[str] = field(default_factory=set)
    aggregates: set[str] = field(default_factory=set)

    def problem(self, name: str, amount: int) -> str:
        inventory = self.inventories.get(name)
        if inventory is None:
            return f"{name}: no inventory"
        return inventory.room_problem(amount, self.used.get(name, 0)) or ""


@dataclass(frozen=True)
class Candidate:
    """One way to allocate the request: provider uuid -> class -> amount."""

    allocations: dict[str, dict[str, int]]


@dataclass(frozen=True)
class Candidates:
    requests: list[Candidate]
    providers: dict[str, Provider]  # every provider of the trees the candidates use
    roots: dict[int, str]  # provider id -> uuid of its root


def find(
    session: Session,
    amounts: Mapping[str, int],
    *,
    traits_ok: Callable[[Set[str]], bool],
    aggregates_ok: Callable[[Set[str]], bool],
    in_tree: str | None = None,
    limit: int | None = None,
) -> Candidates:
    providers = _load(session)
    by_id = {p.id: p for p in providers}
    trees: dict[int, list[Provider]] = {}
    for p in providers:
        trees.setdefault(p.root_id, []).append(p)  # id order: the root first
    sharing = [p for p in providers if SHARING_TRAIT in p.traits and p.up]
    wanted_root = None
    if in_tree is not None:
        found = next((p for p in providers if p.uuid == in_tree), None)
        wanted_root = found.root_id if found is not None else -1
    requests = []
    used_trees: set[int] = set()
    for root_id, tree in sorted(trees.items()):
        root = by_id[root_id]
        if not root.up or (wanted_root is not None and root_id != wanted_root):
            continue
        aggregates = set().union(*(p.aggregates for p in tree))
        shared = [s for s in sharing if s.root_id != root_id and s.aggregates & aggregates]
        reachable = tree + shared
        if not traits_ok(set().union(*(p.traits for p in tree))) or not aggregates_ok(aggregates):
            continue
        fit = fit_in_tree(
            reachable,
            amounts,
            one_node=False,
            offers=lambda p, name: name in p.inventories,
            problem=lambda p, name, amount: p.problem(name, amount),
        )
        if fit.misfit is not None:
            continue
        allocation: dict[str, dict[str, int]] = {}
        for provider, name, amount in fit.plan:
            allocation.setdefault(provider.uuid, {})[name] = amount
            used_trees.add(provider.root_id)
        requests.append(Candidate(allocation))
        if limit is not None and len(requests) >= limit:
            break
    kept = {p.uuid: p for p in providers if p.root_id in used_trees}
    return Candidates(requests, kept, {p.id: by_id[p.root_id].uuid for p in providers})


def _load(session: Session) -> list[Provider]:
    rows = session.execute(
        select(
            HostRow.id, HostRow.uuid, HostRow.root_id, HostRow.parent_id, HostRow.state
        ).order_by(HostRow.id)
    ).all()
    uuid_of = {r.id: r.uuid for r in rows}
    providers = {
        r.id: Provider(
            r.id,
            r.uuid,
            r.root_id or r.id,
            uuid_of.get(r.parent_id) if r.parent_id else None,
            r.state == "up",
        )
        for r in rows
    }
    names = lookup.class_names(session)
    for inv in session.execute(select(*lookup.INVENTORY_COLUMNS)):
        providers[inv.host_id].inventories[names[inv.resource_class_id]] = lookup.inventory_of(inv)
    for host_id, class_id, total in session.execute(
        select(
            AllocationRow.host_id, AllocationRow.resource_class_id, func.sum(AllocationRow.amount)
        ).group_by(AllocationRow.host_id, AllocationRow.resource_class_id)
    ):
        # Pending and active alike: a claim on its way is as used as a running VM.
        providers[host_id].used[names[class_id]] = int(total)
    for host_id, trait in session.execute(
        select(HostTraitRow.host_id, TraitRow.name).join(
            TraitRow, TraitRow.id == HostTraitRow.trait_id
        )
    ):
        providers[host_id].traits.add(trait)
    for host_id, aggregate in session.execute(
        select(HostAggregateRow.host_id, HostAggregateRow.aggregate)
    ):
        providers[host_id].aggregates.add(aggregate.lower())
    return list(providers.values())
