"""The batch decision that keeps host-local plugins' verdicts and raw scores, and asks
them again only about the hosts each decision changed, decides exactly as asking every
plugin about every host for every VM does (``incremental=False``): the same hosts, the
same random draws, the same explanations, breakdowns and per-filter results."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadmaster.cluster.records import GroupRecord
from loadmaster.scheduler.core import (
    Decision,
    LoadedPolicy,
    Snapshot,
    SyntheticHost,
    VmRequest,
    decide,
)
from loadmaster.scheduler.core.plugins import LoadedFilter, Verdict, load_filters, load_weighers
from loadmaster.scheduler.core.policies import POLICIES
from loadmaster.scheduler.core.results import NoHostFits

decide_module = importlib.import_module("loadmaster.scheduler.core.decide")
FILTERS = tuple(load_filters())
GROUPS = {
    "anti": GroupRecord("u1", "anti", "anti-affinity", None),
    "anti2": GroupRecord("u2", "anti2", "anti-affinity", 2),
    "aff": GroupRecord("u3", "aff", "affinity", None),
    "soft": GroupRecord("u4", "soft", "soft-anti-affinity", 2),
    "near": GroupRecord("u5", "near", "soft-affinity", None),
}
FLAVORS = {
    "tiny": {"VCPU": 1, "MEMORY_MB": 512},
    "small": {"VCPU": 2, "MEMORY_MB": 1024},
    "big": {"VCPU": 4, "MEMORY_MB": 4096, "DISK_GB": 20},
    "gpu": {"VCPU": 2, "MEMORY_MB": 1024, "CUSTOM_GPU": 1},
}

host_strategy = st.fixed_dictionaries(
    {
        "vcpu": st.integers(0, 10),
        "used": st.integers(0, 4),
        "memory": st.sampled_from([2048, 8192]),
        "state": st.sampled_from(["up", "up", "up", "maintenance"]),
        "gpu": st.booleans(),
        "avx": st.booleans(),
        "load": st.one_of(st.none(), st.floats(0, 4)),
        "numa": st.booleans(),
        "members": st.integers(0, 2),
    }
)
request_strategy = st.tuples(
    st.sampled_from(sorted(FLAVORS)),
    st.sampled_from([None, None, *GROUPS]),
    st.sampled_from([frozenset(), frozenset({"HW_CPU_X86_AVX2"})]),
    st.booleans(),  # one NUMA node
)


def _host(i: int, spec: dict[str, Any]) -> SyntheticHost:
    capacity = {"VCPU": spec["vcpu"], "MEMORY_MB": spec["memory"], "DISK_GB": 100}
    if spec["gpu"]:
        capacity["CUSTOM_GPU"] = 2
    children: tuple[SyntheticHost, ...] = ()
    if spec["numa"]:
        # The host's CPUs and memory on two NUMA nodes, the rest on the root.
        half = {"VCPU": spec["vcpu"] // 2, "MEMORY_MB": spec["memory"] // 2}
        children = (SyntheticHost(f"h{i}-n0", half), SyntheticHost(f"h{i}-n1", half))
        capacity = {k: v for k, v in capacity.items() if k not in half}
    return SyntheticHost(
        f"h{i}",
        capacity,
        used={"VCPU": min(spec["used"], capacity.get("VCPU", 0))},
        traits=["HW_CPU_X86_AVX2"] if spec["avx"] else [],
        state=spec["state"],
        load=spec["load"],
        children=children,
    )


def _snapshot(hosts: list[dict[str, Any]]) -> Snapshot:
    """Hosts drawn by ``host_strategy``, with the groups' members they say."""
    members = {
        name: {f"h{i}": spec["members"] for i, spec in enumerate(hosts) if spec["members"]}
        for name in ("anti2", "soft", "near")
    }
    groups = members | {"anti": {}, "aff": {}}
    return Snapshot.of([_host(i, spec) for i, spec in enumerate(hosts)], groups)


def _requests(specs: list[tuple[str, str | None, frozenset[str], bool]]) -> list[VmRequest]:
    """Requests drawn by ``request_strategy``."""
    return [
        VmRequest(
            f"v{i}",
            f"v{i}",
            flavor,
            dict(FLAVORS[flavor]),
            required_traits=traits,
            group=GROUPS[group] if group else None,
            one_numa_node=numa,
        )
        for i, (flavor, group, traits, numa) in enumerate(specs)
    ]


def _loaded(policy: str, sample: int | None) -> LoadedPolicy:
    chosen = POLICIES[policy]
    return LoadedPolicy(
        policy, FILTERS, tuple(load_weighers(chosen.weighers)), sample, subset_size=2
    )


def _same(fast: list[Decision], full: list[Decision]) -> None:
    assert [(d.index, d.host) for d in fast] == [(d.index, d.host) for d in full]
    for a, b in zip(fast, full, strict=True):
        assert type(a.error) is type(b.error) and str(a.error) == str(b.error)
        if isinstance(a.error, NoHostFits) and isinstance(b.error, NoHostFits):
            assert a.error.explanation == b.error.explanation
        assert a.scores == b.scores
        assert [r.plugin for r in a.results] == [r.plugin for r in b.results]
        for ra, rb in zip(a.results, b.results, strict=True):
            assert np.array_equal(ra.verdict.keep, rb.verdict.keep)
            assert [r for _, r in ra.verdict.checks] == [r for _, r in rb.verdict.checks]
            for (ok_a, _), (ok_b, _) in zip(ra.verdict.checks, rb.verdict.checks, strict=True):
                assert np.array_equal(ok_a, ok_b)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hosts=st.lists(host_strategy, min_size=1, max_size=8),
    requests=st.lists(request_strategy, min_size=1, max_size=30),
    policy=st.sampled_from(["spread", "pack", "vm-count"]),
    sample=st.sampled_from([None, 2, 5]),
    seed=st.integers(0, 2**32 - 1),
    all_or_nothing=st.booleans(),
    breakdown=st.booleans(),
    full_after=st.sampled_from([0, 1, 64]),
)
def test_incremental_decisions_are_the_full_recomputes(
    hosts: list[dict[str, Any]],
    requests: list[tuple[str, str | None, frozenset[str], bool]],
    policy: str,
    sample: int | None,
    seed: int,
    all_or_nothing: bool,
    breakdown: bool,
    full_after: int,
) -> None:
    snap = _snapshot(hosts)
    reqs = _requests(requests)
    loaded = _loaded(policy, sample)
    kw: dict[str, Any] = {"all_or_nothing": all_or_nothing, "breakdown": breakdown}
    saved = decide_module.FULL_AFTER
    decide_module.FULL_AFTER = full_after
    try:
        fast = decide(snap, reqs, loaded, seed, **kw)
    finally:
        decide_module.FULL_AFTER = saved
    full = decide(snap, reqs, loaded, seed, incremental=False, **kw)
    _same(fast, full)


def test_the_plugins_loadmaster_ships_declare_what_keeps_them_host_local() -> None:
    local = {f.name for f in FILTERS if f.local is not None}
    assert local == {"resources", "anti_affinity", "max_per_host"}
    # Affinity asks whether the group has any member at all: not host-local.
    assert all(f.local is None for f in FILTERS if f.name == "affinity")


def test_a_host_local_filter_is_asked_again_only_about_the_hosts_that_changed() -> None:
    seen: list[int | None] = []

    class Room:
        name = "room"
        dynamic = True
        reads = ("resources",)

        def mask(self, hosts: Snapshot, request: VmRequest) -> Any:
            seen.append(None)
            return self.mask_at(hosts, request, np.arange(hosts.size))

        def mask_at(self, hosts: Snapshot, request: VmRequest, at: Any) -> Any:
            if len(at) != hosts.size:
                seen.extend(int(h) for h in at)
            free = hosts.capacity[0][at] - hosts.used[0][at]
            return Verdict.one_reason(free >= request.resources["VCPU"], "full")

    room = Room()
    entry = LoadedFilter("room", room, None, True, 1, frozenset({"resources"}), room)
    snap = Snapshot.of([SyntheticHost(f"h{i}", {"VCPU": 2}) for i in range(4)])
    reqs = [VmRequest(f"v{i}", f"v{i}", "f", {"VCPU": 1}) for i in range(8)]
    decisions = decide(snap, reqs, LoadedPolicy("p", (entry,)), seed=3)
    assert sorted(d.host for d in decisions if d.host is not None) == [0, 0, 1, 1, 2, 2, 3, 3]
    # Once over every host, then once per decision about the one host it changed.
    assert seen[0] is None and seen.count(None) == 1
    assert seen[1:] == [d.host for d in decisions[:-1]]


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.dictionaries(st.sampled_from(["VCPU", "MEMORY_MB", "DISK_GB"]), st.integers(0, 8)),
    used=st.integers(0, 8),
    step=st.sampled_from([1, 2]),
    amounts=st.dictionaries(st.sampled_from(["VCPU", "MEMORY_MB", "DISK_GB"]), st.integers(0, 9)),
)
def test_a_claim_on_a_host_of_one_provider_lands_where_fit_in_tree_puts_it(
    capacity: dict[str, int], used: int, step: int, amounts: dict[str, int]
) -> None:
    """``Snapshot.apply``'s shortcut for trees of one provider is ``fit_in_tree``."""
    from loadmaster.resources.tree_fit import fit_in_tree

    units = {name: (1, total, step) for name, total in capacity.items()}
    host = SyntheticHost("h", capacity, {"VCPU": used}, units=units)
    snap = Snapshot.of([host, SyntheticHost("x", {"VCPU": 1, "MEMORY_MB": 1, "DISK_GB": 1})])
    amounts = {name: amount for name, amount in amounts.items() if name in snap.classes}
    fit = fit_in_tree(
        snap.tree[0],
        amounts,
        one_node=False,
        offers=lambda row, name: bool(snap.max_unit[snap.classes[name], row] > 0),
        problem=lambda row, name, amount: (
            "" if snap._room(snap.classes[name], row, amount) else "full"
        ),
    )
    expected = [(row, snap.classes[name], amount) for row, name, amount in fit.plan]
    assert snap.flat and snap.placing(0, amounts, False) == expected
