"""Random small provider trees with sharing providers, traits, aggregates and pending
claims: every allocation candidate loadmaster gives meets Placement's definition, and
none is given twice.

The definition, checked on each candidate from what the ledger reports (not from the
search's own data): each amount fits its provider now (capacity less active and pending
records, ``max_unit``); the unnumbered group's providers have its required traits
between them, none has a forbidden one, each is in ``member_of``'s aggregates or under a
root that is; the numbered group's provider has that group's traits and aggregates
itself; the providers are one tree's and sharing providers that share an aggregate with
that tree."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any
from unittest.mock import patch

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.errors import LoadmasterError
from loadmaster.pending.candidates import SHARING_TRAIT, RequestGroup, _World
from loadmaster.resources.selectors import MemberOf, Required

CLASSES = ("VCPU", "MEMORY_MB", "DISK_GB")
TRAITS = ("CUSTOM_A", "CUSTOM_B")
AGGREGATES = (str(uuid.UUID(int=1)), str(uuid.UUID(int=2)))

# (parent index or None, inventories, traits, aggregates, sharing)
PROVIDER = st.tuples(
    st.one_of(st.none(), st.integers(0, 6)),
    st.dictionaries(st.sampled_from(CLASSES), st.integers(1, 6), max_size=2),
    st.sets(st.sampled_from(TRAITS)),
    st.sets(st.sampled_from(AGGREGATES), max_size=1),
    st.booleans(),
)
NAMES = st.sets(st.sampled_from(TRAITS))
GROUP = st.tuples(
    st.dictionaries(st.sampled_from(CLASSES), st.integers(1, 3), min_size=1, max_size=3),
    NAMES,  # required
    NAMES,  # forbidden
    st.one_of(st.none(), st.sampled_from(AGGREGATES)),  # member_of
)


def _rule(required: set[str], forbidden: set[str]) -> Required:
    return Required(frozenset(required - forbidden), (), frozenset(forbidden))


def _build(lm: loadmaster.Loadmaster, providers: list[Any], claims: list[int]) -> list[str]:
    for trait in TRAITS:
        lm.traits.create(trait)
    made: list[str] = []
    for i, (parent, inventories, traits, aggregates, sharing) in enumerate(providers):
        # A sharing provider is a root (as Placement's are); others may hang under one.
        above = made[parent % len(made)] if parent is not None and made and not sharing else None
        inventories = {c: {"total": t} for c, t in inventories.items()}
        if sharing:
            inventories = {"DISK_GB": {"total": 6}}
            traits = {*traits, SHARING_TRAIT}
        host = lm.hosts.create(
            f"p{i}",
            parent=above,
            traits=sorted(traits),
            aggregates=sorted(aggregates),
            inventories=inventories,
        )
        made.append(host.uuid)
    lm.flavors.create({"name": "one", "resources": {"VCPU": 1}})
    for n, target in enumerate(claims):
        vm = lm.vms.create_many([VmSpec(f"v{n}", "one")])[0]
        # Pending records on a root's tree, where the tree-fit rule puts them (or none).
        with contextlib.suppress(LoadmasterError):
            lm.allocations.claim(vm.uuid, made[target % len(made)])
    return made


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    providers=st.lists(PROVIDER, min_size=2, max_size=7),
    claims=st.lists(st.integers(0, 6), max_size=4),
    unnumbered=GROUP,
    numbered=st.one_of(st.none(), GROUP),
)
def test_every_candidate_meets_the_definition_once(
    tmp_path: Path,
    providers: list[Any],
    claims: list[int],
    unnumbered: Any,
    numbered: Any,
) -> None:
    lm = loadmaster.open(f"sqlite:///{tmp_path / f'c-{uuid.uuid4().hex}.db'}")
    try:
        _build(lm, providers, claims)
        groups = _groups(unnumbered, numbered)
        found = lm.allocations.candidates(groups)
        usages = lm.allocations.usages()
        hosts = {h.uuid: h for h in lm.hosts.list()}
        root_of = {
            h.uuid: found.roots[found.providers[h.uuid].id]
            for h in hosts.values()
            if h.uuid in found.providers
        }
        seen = set()
        for candidate in found.requests:
            key = json.dumps([candidate.allocations, candidate.mappings], sort_keys=True)
            assert key not in seen, "a candidate given twice"
            seen.add(key)
            for provider, amounts in candidate.allocations.items():
                host = hosts[provider]
                for name, amount in amounts.items():
                    use = usages[host.name][name]
                    assert amount <= use.capacity - use.active - use.pending, (provider, name)
                    assert amount <= host.inventories[name].max_unit
            trees = {
                root_of[p] for p in candidate.allocations if SHARING_TRAIT not in hosts[p].traits
            }
            assert len(trees) <= 1, "providers of two trees"
            tree_aggregates = set().union(
                *(set(h.aggregates) for h in hosts.values() if root_of.get(h.uuid) in trees)
            )
            for provider in candidate.allocations:
                host = hosts[provider]
                if SHARING_TRAIT in host.traits and root_of[provider] not in trees and trees:
                    assert set(host.aggregates) & tree_aggregates, "a sharing provider not shared"
            for group in groups:
                mapped = [hosts[u] for u in candidate.mappings[group.suffix]]
                if group.suffix:
                    (only,) = mapped
                    assert group.required.admits(set(only.traits))
                    assert group.member_of.admits(set(only.aggregates))
                    continue
                assert group.required.admits(set().union(*(set(h.traits) for h in mapped)))
                for host in mapped:
                    assert not set(host.traits) & group.required.none_of
                    root = hosts[root_of[host.uuid]]
                    assert group.member_of.within(set(host.aggregates)) or group.member_of.within(
                        set(root.aggregates)
                    )
    finally:
        lm.close()


def _groups(unnumbered: Any, numbered: Any) -> list[RequestGroup]:
    groups = []
    for suffix, group in (("", unnumbered), ("1", numbered)):
        if group is None:
            continue
        amounts, required, forbidden, aggregate = group
        member_of = MemberOf((frozenset({aggregate}),)) if aggregate else MemberOf()
        groups.append(RequestGroup(suffix, amounts, _rule(required, forbidden), member_of))
    return groups


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    providers=st.lists(PROVIDER, min_size=2, max_size=7),
    claims=st.lists(st.integers(0, 6), max_size=4),
    unnumbered=GROUP,
    numbered=st.one_of(st.none(), GROUP),
)
def test_a_host_alone_in_its_tree_gives_what_the_full_search_gives(
    tmp_path: Path,
    providers: list[Any],
    claims: list[int],
    unnumbered: Any,
    numbered: Any,
) -> None:
    """The shortcut for a root without children or sharing (most hosts of a cloud) gives
    the same candidates, in the same order, as the search through every combination."""
    lm = loadmaster.open(f"sqlite:///{tmp_path / f'a-{uuid.uuid4().hex}.db'}")
    try:
        _build(lm, providers, claims)
        groups = _groups(unnumbered, numbered)
        quick = lm.allocations.candidates(groups).requests
        with patch.object(_World, "alone", lambda _self, _root: False):
            full = lm.allocations.candidates(groups).requests
        assert quick == full
    finally:
        lm.close()
