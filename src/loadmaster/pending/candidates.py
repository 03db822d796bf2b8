"""Placement's allocation candidates: where a request's amounts could be allocated now,
each candidate a set of providers (one host's tree, plus sharing providers that host
reaches through an aggregate), with pending claims counted as used.

A request is Placement's request groups. A numbered group (``resources1=...``, with its
own ``required1``, ``member_of1``, ``in_tree1``) comes whole from one provider with those
traits and aggregates; with ``group_policy=isolate`` no two numbered groups share one;
``same_subtree`` makes the providers of the named groups one subtree (one of them an
ancestor of the others); ``root_required`` judges the root's traits. The unnumbered group
then places every class by the tree-fit rule (``resources/tree_fit.py``), the same one
claims follow, with the sharing providers after the tree's own: a class the tree offers
comes from the tree, one it lacks from a sharing provider. Each tree gives at most one
candidate, its first fit in provider order (Placement lists every combination; Nova takes
the first). Hosts that are not ``up`` offer nothing: loadmaster places nothing new there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
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

    def problem(self, name: str, amount: int, taken: int = 0) -> str:
        """Why ``amount`` does not fit ("" if it does), with ``taken`` more in use by the
        candidate's other groups."""
        inventory = self.inventories.get(name)
        if inventory is None:
            return f"{name}: no inventory"
        return inventory.room_problem(amount, self.used.get(name, 0) + taken) or ""


def _anything(_: Set[str]) -> bool:
    return True


@dataclass(frozen=True)
class RequestGroup:
    """One request group; ``suffix`` "" is the unnumbered one."""

    suffix: str
    amounts: Mapping[str, int]
    traits_ok: Callable[[Set[str]], bool] = _anything
    aggregates_ok: Callable[[Set[str]], bool] = _anything
    in_tree: str | None = None


@dataclass(frozen=True)
class Candidate:
    """One way to allocate the request: provider uuid -> class -> amount; ``mappings``:
    each group's suffix -> the providers that serve it."""

    allocations: dict[str, dict[str, int]]
    mappings: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidates:
    requests: list[Candidate]
    providers: dict[str, Provider]  # every provider of the trees the candidates use
    roots: dict[int, str]  # provider id -> uuid of its root


def find(
    session: Session,
    groups: Sequence[RequestGroup],
    *,
    isolate: bool = False,
    root_ok: Callable[[Set[str]], bool] = _anything,
    same_subtree: Sequence[Sequence[str]] = (),
    limit: int | None = None,
) -> Candidates:
    providers = _load(session)
    by_id = {p.id: p for p in providers}
    by_uuid = {p.uuid: p for p in providers}
    trees: dict[int, list[Provider]] = {}
    for p in providers:
        trees.setdefault(p.root_id, []).append(p)  # id order: the root first
    sharing = [p for p in providers if SHARING_TRAIT in p.traits and p.up]
    search = _Search(
        [g for g in groups if g.suffix],
        next((g for g in groups if not g.suffix), None),
        isolate,
        [list(names) for names in same_subtree],
        {uuid: (by_uuid[uuid].root_id if uuid in by_uuid else -1) for uuid in _trees(groups)},
        by_uuid,
    )
    requests = []
    used_trees: set[int] = set()
    for root_id, tree in sorted(trees.items()):
        root = by_id[root_id]
        if not root.up or not root_ok(root.traits):
            continue
        aggregates = set().union(*(p.aggregates for p in tree))
        shared = [s for s in sharing if s.root_id != root_id and s.aggregates & aggregates]
        candidate = search.tree(root_id, tree, shared)
        if candidate is None:
            continue
        used_trees.update(by_uuid[u].root_id for u in candidate.allocations)
        requests.append(candidate)
        if limit is not None and len(requests) >= limit:
            break
    kept = {p.uuid: p for p in providers if p.root_id in used_trees}
    return Candidates(requests, kept, {p.id: by_id[p.root_id].uuid for p in providers})


def _trees(groups: Sequence[RequestGroup]) -> set[str]:
    return {g.in_tree for g in groups if g.in_tree is not None}


@dataclass
class _Search:
    """The first way one tree (and the sharing providers it reaches) serves every group."""

    numbered: list[RequestGroup]
    unnumbered: RequestGroup | None
    isolate: bool
    same_subtree: list[list[str]]
    root_of_tree: dict[str, int]  # in_tree uuid -> its root's id (-1: no such provider)
    by_uuid: dict[str, Provider]

    def tree(self, root_id: int, tree: list[Provider], shared: list[Provider]) -> Candidate | None:
        group = self.unnumbered
        if group is not None:
            if group.in_tree is not None and self.root_of_tree[group.in_tree] != root_id:
                return None
            if not group.traits_ok(set().union(*(p.traits for p in tree))):
                return None
            if not group.aggregates_ok(set().union(*(p.aggregates for p in tree))):
                return None
        elif not self.numbered:
            return None
        return self._assign(0, tree + shared, {}, {})

    def _assign(
        self,
        index: int,
        reachable: list[Provider],
        chosen: dict[str, Provider],
        taken: dict[tuple[str, str], int],
    ) -> Candidate | None:
        if index == len(self.numbered):
            return self._finish(reachable, chosen, taken)
        group = self.numbered[index]
        for provider in reachable:
            if self.isolate and any(p is provider for p in chosen.values()):
                continue
            if not self._serves(group, provider, taken):
                continue
            chosen[group.suffix] = provider
            for name, amount in group.amounts.items():
                taken[(provider.uuid, name)] = taken.get((provider.uuid, name), 0) + amount
            found = self._assign(index + 1, reachable, chosen, taken)
            if found is not None:
                return found
            del chosen[group.suffix]
            for name, amount in group.amounts.items():
                taken[(provider.uuid, name)] -= amount
        return None

    def _serves(
        self, group: RequestGroup, provider: Provider, taken: dict[tuple[str, str], int]
    ) -> bool:
        if group.in_tree is not None and self.root_of_tree[group.in_tree] != provider.root_id:
            return False
        if not group.traits_ok(provider.traits) or not group.aggregates_ok(provider.aggregates):
            return False
        return not any(
            provider.problem(name, amount, taken.get((provider.uuid, name), 0))
            for name, amount in group.amounts.items()
        )

    def _finish(
        self,
        reachable: list[Provider],
        chosen: dict[str, Provider],
        taken: dict[tuple[str, str], int],
    ) -> Candidate | None:
        for names in self.same_subtree:
            if not self._one_subtree([chosen[n] for n in names if n in chosen]):
                return None
        allocations: dict[str, dict[str, int]] = {}
        mappings: dict[str, list[str]] = {}
        for group in self.numbered:
            provider = chosen[group.suffix]
            mappings[group.suffix] = [provider.uuid]
            for name, amount in group.amounts.items():
                mine = allocations.setdefault(provider.uuid, {})
                mine[name] = mine.get(name, 0) + amount
        unnumbered = self.unnumbered
        if unnumbered is not None and unnumbered.amounts:
            fit = fit_in_tree(
                reachable,
                unnumbered.amounts,
                one_node=False,
                offers=lambda p, name: name in p.inventories,
                problem=lambda p, name, amount: p.problem(
                    name, amount, taken.get((p.uuid, name), 0)
                ),
            )
            if fit.misfit is not None:
                return None
            for provider, name, amount in fit.plan:
                mine = allocations.setdefault(provider.uuid, {})
                mine[name] = mine.get(name, 0) + amount
                if provider.uuid not in mappings.setdefault("", []):
                    mappings[""].append(provider.uuid)
        return Candidate(allocations, mappings)

    def _one_subtree(self, providers: list[Provider]) -> bool:
        """One of them is an ancestor of (or the same as) every other."""
        lines = [self._ancestry(p) for p in providers]
        return any(all(p.uuid in line for line in lines) for p in providers)

    def _ancestry(self, provider: Provider) -> set[str]:
        line = {provider.uuid}
        while provider.parent_uuid is not None:
            provider = self.by_uuid[provider.parent_uuid]
            line.add(provider.uuid)
        return line


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
