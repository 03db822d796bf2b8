"""Placement's allocation candidates: every way a request's groups could be allocated now,
with pending claims counted as used.

A candidate is anchored at one tree's root: it takes from that tree's providers and from
sharing providers (trait ``MISC_SHARES_VIA_AGGREGATE``) that share an aggregate with a
provider of the tree (a sharing provider anchors at its own tree too). Per group, as
Placement's ``allocation_candidate.py`` judges it:

- a numbered group (``resources1=...``) comes whole from one provider that itself has the
  group's traits and aggregates, in ``in_tree1``'s tree if named; a resourceless one
  (1.36, only inside ``same_subtree``) names a provider with those traits;
- the unnumbered group takes each class from one provider of the tree or a sharing one,
  each with room for it and none with a forbidden trait, each in ``member_of``'s
  aggregates or under a root that is, and the providers it allocates from must have its
  required traits between them;
- ``group_policy=isolate``: numbered groups on different providers; ``same_subtree``: the
  named groups' providers under one of them; ``root_required``: the anchor root's traits.

Every distinct combination is a candidate, once (a sharing provider reached from two
trees gives one): anchors in creation order, each group's choices in provider creation
order, so the order is stable and ``limit`` stops the search instead of trimming a list
built whole. With a random generator the anchors and choices are shuffled (Placement's
``randomize_allocation_candidates``), which samples trees evenly but keeps one tree's
candidates together. Hosts that are not ``up`` offer nothing: loadmaster places nothing
new there.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from itertools import product

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.resources import Inventory, class_order
from loadmaster.resources.selectors import MemberOf, Required
from loadmaster.resources.traits import SHARING_TRAIT
from loadmaster.store.locking import execute_core
from loadmaster.store.schema import (
    AllocationRow,
    HostAggregateRow,
    HostRow,
    HostTraitRow,
    TraitRow,
)


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

    def room(self, name: str, amount: int) -> bool:
        """Whether ``amount`` fits now: the unit rules, and capacity less what is used."""
        inventory = self.inventories.get(name)
        return inventory is not None and not inventory.room_problem(amount, self.used.get(name, 0))

    def room_for_sum(self, name: str, amount: int) -> bool:
        """Whether the amounts several groups take, summed, fit: capacity and ``max_unit``
        (each group's own amount met the other unit rules already), as Placement checks."""
        inventory = self.inventories[name]
        return (
            amount <= inventory.max_unit and self.used.get(name, 0) + amount <= inventory.capacity
        )


@dataclass(frozen=True)
class RequestGroup:
    """One request group; ``suffix`` "" is the unnumbered one."""

    suffix: str
    amounts: Mapping[str, int]
    required: Required = field(default_factory=Required)
    member_of: MemberOf = field(default_factory=MemberOf)
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


# What makes two candidates the same (Placement's ``AllocationRequest.__eq__``): the
# amounts per provider and class, and each group's providers.
_Key = tuple[frozenset[tuple[int, str, int]], tuple[tuple[str, tuple[int, ...]], ...]]


@dataclass(frozen=True)
class _Choice:
    """One way one group is served at one anchor: (provider id, class, amount) each, and
    the providers the group maps to."""

    amounts: tuple[tuple[int, str, int], ...]
    providers: tuple[int, ...]


def find(
    session: Session,
    groups: Sequence[RequestGroup],
    *,
    isolate: bool = False,
    root_ok: Callable[[Set[str]], bool] = lambda _: True,
    same_subtree: Sequence[Sequence[str]] = (),
    limit: int | None = None,
    nested_aware: bool = True,
    rng: random.Random | None = None,
) -> Candidates:
    """``nested_aware=False`` (before 1.29): no candidate takes from two providers of one
    tree. ``rng``: shuffle, as Placement's ``randomize_allocation_candidates``."""
    world = _World(_load(session))
    search = _Search(world, groups, isolate, root_ok, same_subtree, nested_aware, rng)
    requests = []
    for candidate in search.candidates():
        requests.append(candidate)
        if limit is not None and len(requests) >= limit:
            break
    used_trees = {world.by_uuid[u].root_id for c in requests for u in c.allocations}
    return Candidates(
        requests,
        {p.uuid: p for p in world.providers if p.root_id in used_trees},
        {p.id: world.by_id[p.root_id].uuid for p in world.providers},
    )


class _World:
    """Every provider, with the trees and the anchors of sharing providers."""

    def __init__(self, providers: list[Provider]) -> None:
        self.providers = providers  # id order
        self.by_id = {p.id: p for p in providers}
        self.by_uuid = {p.uuid: p for p in providers}
        self.trees: dict[int, list[Provider]] = {}
        roots_in: dict[str, set[int]] = {}
        for p in providers:
            self.trees.setdefault(p.root_id, []).append(p)
            for aggregate in p.aggregates:
                roots_in.setdefault(aggregate, set()).add(p.root_id)
        self.roots = sorted(r for r in self.trees if self.by_id[r].up)
        # Anchor root id -> the sharing providers of other trees it reaches, id order.
        self.shared_at: dict[int, list[Provider]] = {}
        self.sharing_anchors: dict[int, set[int]] = {}
        for p in providers:
            if SHARING_TRAIT not in p.traits or not self.usable(p):
                continue
            anchors = {p.root_id}.union(*(roots_in[a] for a in p.aggregates))
            self.sharing_anchors[p.id] = anchors
            for root in anchors - {p.root_id}:
                self.shared_at.setdefault(root, []).append(p)

    def alone(self, root_id: int) -> bool:
        """A root with no child, reaching no sharing provider and shared by no other tree:
        every candidate there takes from the root only, and no other anchor repeats it."""
        return (
            len(self.trees[root_id]) == 1
            and root_id not in self.shared_at
            and root_id not in self.sharing_anchors
        )

    def usable(self, provider: Provider) -> bool:
        return self.by_id[provider.root_id].up

    def root_of(self, uuid: str | None) -> int | None:
        """The root id of ``in_tree``'s provider; -1 when there is no such provider."""
        if uuid is None:
            return None
        found = self.by_uuid.get(uuid)
        return found.root_id if found is not None else -1

    def ancestry(self, provider_id: int) -> set[int]:
        provider = self.by_id[provider_id]
        line = {provider.id}
        while provider.parent_uuid is not None:
            provider = self.by_uuid[provider.parent_uuid]
            line.add(provider.id)
        return line


@dataclass
class _Search:
    world: _World
    groups: Sequence[RequestGroup]
    isolate: bool
    root_ok: Callable[[Set[str]], bool]
    same_subtree: Sequence[Sequence[str]]
    nested_aware: bool
    rng: random.Random | None

    def candidates(self) -> Iterator[Candidate]:
        """Each distinct candidate once, anchor by anchor."""
        unnumbered = next((g for g in self.groups if not g.suffix), None)
        numbered = [g for g in self.groups if g.suffix]
        by_anchor = [self._single(g) for g in numbered]
        suffixes = ([""] if unnumbered is not None else []) + [g.suffix for g in numbered]
        anchors = [r for r in self.world.roots if self.root_ok(self.world.by_id[r].traits)]
        if self.rng is not None:
            self.rng.shuffle(anchors)
        seen: set[_Key] = set()
        alone = unnumbered if not numbered else None
        for anchor in anchors:
            if alone is not None and self.world.alone(anchor):
                candidate = self._by_itself(alone, anchor)
                if candidate is not None:
                    yield candidate
                continue
            lists = [choices.get(anchor, []) for choices in by_anchor]
            if unnumbered is not None:
                lists.insert(0, self._spread(unnumbered, anchor))
            if not all(lists):
                continue
            if self.rng is not None:
                lists = [self.rng.sample(choices, len(choices)) for choices in lists]
            for picked in self._combinations(lists, suffixes):
                candidate = self._candidate(picked, suffixes, seen)
                if candidate is not None:
                    yield candidate

    def _by_itself(self, group: RequestGroup, anchor: int) -> Candidate | None:
        """The one group at a root that is a tree by itself (``_World.alone``): what
        ``_spread`` and ``_candidate`` would make of it, without their combinations.
        Most of a large cloud is such hosts, and each candidate costs here a tenth."""
        tree = self.world.root_of(group.in_tree)
        root = self.world.by_id[anchor]
        if (
            (tree is not None and tree != anchor)
            or root.traits & group.required.none_of
            or not group.member_of.admits(root.aggregates)
            or not group.required.admits(root.traits)
            or not all(root.room(name, amount) for name, amount in group.amounts.items())
        ):
            return None
        names = sorted(group.amounts, key=lambda n: (class_order(n), n))
        return Candidate(
            {root.uuid: {name: group.amounts[name] for name in names}},
            {group.suffix: [root.uuid]},
        )

    def _single(self, group: RequestGroup) -> dict[int, list[_Choice]]:
        """A numbered group: per anchor root, the providers that serve it whole."""
        tree = self.world.root_of(group.in_tree)
        found: dict[int, list[_Choice]] = {}
        for p in self.world.providers:
            if not self.world.usable(p) or (tree is not None and p.root_id != tree):
                continue
            if not group.required.admits(p.traits) or not group.member_of.admits(p.aggregates):
                continue
            if not all(p.room(name, amount) for name, amount in group.amounts.items()):
                continue
            choice = _Choice(tuple((p.id, n, a) for n, a in group.amounts.items()), (p.id,))
            for anchor in self.world.sharing_anchors.get(p.id, {p.root_id}):
                found.setdefault(anchor, []).append(choice)
        return found

    def _spread(self, group: RequestGroup, anchor: int) -> list[_Choice]:
        """The unnumbered group at one anchor: each class from one provider of the tree or
        a sharing one, every combination whose providers have the required traits."""
        tree = self.world.root_of(group.in_tree)
        if tree is not None and tree != anchor:
            return []
        root = self.world.by_id[anchor]
        rule = group.member_of
        under_root = rule.within(root.aggregates)
        if not rule.outside(root.aggregates):
            return []
        forbidden = group.required.none_of
        own = [
            p
            for p in self.world.trees[anchor]
            if not p.traits & forbidden
            and (under_root or rule.within(p.aggregates))
            and rule.outside(p.aggregates)
        ]
        # ``in_tree`` keeps the request in that tree: no sharing provider of another.
        shared = [
            s
            for s in (self.world.shared_at.get(anchor, []) if tree is None else [])
            if not s.traits & forbidden and rule.admits(s.aggregates)
        ]
        names = sorted(group.amounts, key=lambda n: (class_order(n), n))
        options = []
        for name in names:
            amount = group.amounts[name]
            offering = [p for p in own + shared if p.room(name, amount)]
            if not offering:
                return []
            options.append(offering)
        choices = []
        for combination in product(*options):
            traits = set().union(*(p.traits for p in combination))
            if not group.required.admits(traits):
                continue
            amounts = tuple(
                (p.id, name, group.amounts[name])
                for p, name in zip(combination, names, strict=True)
            )
            choices.append(_Choice(amounts, tuple(sorted({p.id for p in combination}))))
        return choices

    def _combinations(
        self, lists: list[list[_Choice]], suffixes: list[str]
    ) -> Iterator[list[_Choice]]:
        """One choice per group, depth first, leaving out as soon as a prefix takes more
        than a provider has or (``isolate``) puts two numbered groups on one provider."""
        picked: list[_Choice] = []
        taken: dict[tuple[int, str], int] = {}
        isolated: set[int] = set()

        def walk(index: int) -> Iterator[list[_Choice]]:
            if index == len(lists):
                yield list(picked)
                return
            numbered = bool(suffixes[index])
            for choice in lists[index]:
                if self.isolate and numbered and isolated.intersection(choice.providers):
                    continue
                if not all(
                    self.world.by_id[p].room_for_sum(name, taken[(p, name)] + amount)
                    for p, name, amount in choice.amounts
                    if (p, name) in taken
                ):
                    continue
                for provider_id, name, amount in choice.amounts:
                    taken[(provider_id, name)] = taken.get((provider_id, name), 0) + amount
                if self.isolate and numbered:
                    isolated.update(choice.providers)
                picked.append(choice)
                yield from walk(index + 1)
                picked.pop()
                if self.isolate and numbered:
                    isolated.difference_update(choice.providers)
                for provider_id, name, amount in choice.amounts:
                    taken[(provider_id, name)] -= amount
                    if not taken[(provider_id, name)]:
                        del taken[(provider_id, name)]

        yield from walk(0)

    def _candidate(
        self,
        picked: list[_Choice],
        suffixes: list[str],
        seen: set[_Key],
    ) -> Candidate | None:
        """The picked choices as one candidate, or None: another subtree than
        ``same_subtree`` asks, two providers of one tree before 1.29, or seen already."""
        mapped = {suffix: choice.providers for suffix, choice in zip(suffixes, picked, strict=True)}
        for names in self.same_subtree:
            chosen = set().union(*(mapped[n] for n in names if n in mapped))
            if not self._one_subtree(chosen):
                return None
        summed: dict[tuple[int, str], int] = {}
        for choice in picked:
            for provider_id, name, amount in choice.amounts:
                summed[(provider_id, name)] = summed.get((provider_id, name), 0) + amount
        if not self.nested_aware:
            roots = [self.world.by_id[p].root_id for p in {p for p, _ in summed}]
            if len(roots) != len(set(roots)):
                return None
        key = (
            frozenset((p, n, a) for (p, n), a in summed.items()),
            tuple(sorted(mapped.items())),
        )
        if key in seen:
            return None
        seen.add(key)
        allocations: dict[str, dict[str, int]] = {}
        # Providers in creation order, each one's classes in Placement's order.
        for (provider_id, name), amount in sorted(
            summed.items(), key=lambda item: (item[0][0], class_order(item[0][1]), item[0][1])
        ):
            allocations.setdefault(self.world.by_id[provider_id].uuid, {})[name] = amount
        mappings = {
            suffix: [self.world.by_id[p].uuid for p in providers]
            for suffix, providers in mapped.items()
        }
        return Candidate(allocations, mappings)

    def _one_subtree(self, providers: set[int]) -> bool:
        """One of them is an ancestor of (or the same as) every other."""
        if len(providers) <= 1:
            return True
        common = set.intersection(*(self.world.ancestry(p) for p in providers))
        return bool(common & providers)


def _load(session: Session) -> list[Provider]:
    rows = execute_core(
        session,
        select(
            HostRow.id, HostRow.uuid, HostRow.root_id, HostRow.parent_id, HostRow.state
        ).order_by(HostRow.id),
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
    for inv in execute_core(session, select(*lookup.INVENTORY_COLUMNS)):
        providers[inv.host_id].inventories[names[inv.resource_class_id]] = lookup.inventory_of(inv)
    for host_id, class_id, total in execute_core(
        session,
        select(
            AllocationRow.host_id, AllocationRow.resource_class_id, func.sum(AllocationRow.amount)
        ).group_by(AllocationRow.host_id, AllocationRow.resource_class_id),
    ):
        # Pending and active alike: a claim on its way is as used as a running VM.
        providers[host_id].used[names[class_id]] = int(total)
    for host_id, trait in execute_core(
        session,
        select(HostTraitRow.host_id, TraitRow.name).join(
            TraitRow, TraitRow.id == HostTraitRow.trait_id
        ),
    ):
        providers[host_id].traits.add(trait)
    for host_id, aggregate in execute_core(
        session, select(HostAggregateRow.host_id, HostAggregateRow.aggregate)
    ):
        providers[host_id].aggregates.add(aggregate.lower())
    return list(providers.values())
