"""A large spreading batch decided in rounds (``decide._decide_round``): many requests per
numpy pass. Not the same hosts as one at a time (which sampled host wins may differ), so
what is held here is what one at a time promises: every host taken passes every filter
with every decision before it counted, a request is refused only when no host fits it
then, the same seed gives the same decisions, and a dry run's breakdown is that of the
host the real run takes."""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_incremental import (
    GROUPS,
    _loaded,
    _requests,
    _snapshot,
    host_strategy,
    request_strategy,
)
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster.pending import audit
from loadmaster.scheduler import RequestSpec
from loadmaster.scheduler.core import (
    Decision,
    LoadedPolicy,
    Snapshot,
    SyntheticHost,
    VmRequest,
    decide,
)
from loadmaster.scheduler.core.decide import filter_hosts
from loadmaster.scheduler.core.policies import POLICIES
from loadmaster.scheduler.core.results import NoHostFits
from loadmaster.service import Loadmaster

decide_module = importlib.import_module("loadmaster.scheduler.core.decide")


def _replay_holds(snap: Snapshot, loaded: LoadedPolicy, decisions: list[Decision]) -> None:
    """Decided one after the other on a working copy: each host kept by every filter at
    its turn, each refusal made when no host was kept."""
    state = snap.working()
    for decision in decisions:
        request = decision.request
        _, keep = filter_hosts(state, request, loaded)
        if decision.host is None:
            assert isinstance(decision.error, NoHostFits)
            group = request.group
            if group is not None and group.policy == "affinity" and not request.companions:
                continue  # its first member, carrying it, fit nowhere: refused with it
            assert not keep.any(), f"{request.label} refused with hosts left"
            continue
        assert keep[decision.host], f"{request.label} on a host a filter rejects"
        group = request.group
        state.apply(
            decision.host,
            request.resources,
            group.name if group is not None else None,
            one_node=request.one_numa_node,
        )


@pytest.fixture
def alone(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many requests are decided one at a time (``_decide_one``), counted."""
    count = [0]
    one = decide_module._decide_one

    def counted(*args: Any, **kwargs: Any) -> Decision:
        count[0] += 1
        return one(*args, **kwargs)

    monkeypatch.setattr(decide_module, "_decide_one", counted)
    return count


@pytest.fixture
def small_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds from 2 requests, 3 at a time whatever the hosts: hypothesis's small
    examples exercise them."""
    monkeypatch.setattr(decide_module, "ROUNDS_FROM", 2)
    monkeypatch.setattr(decide_module, "ROUND", 3)
    monkeypatch.setattr(decide_module, "ROUND_SHARE", 1)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    hosts=st.lists(host_strategy, min_size=1, max_size=10),
    requests=st.lists(request_strategy, min_size=2, max_size=30),
    policy=st.sampled_from(["spread", "vm-count"]),
    sample=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**32 - 1),
    breakdown=st.booleans(),
)
def test_every_host_a_round_takes_passes_every_filter_in_turn(
    small_rounds: None,
    hosts: list[dict[str, Any]],
    requests: list[tuple[str, str | None, frozenset[str], bool]],
    policy: str,
    sample: int,
    seed: int,
    breakdown: bool,
) -> None:
    snap = _snapshot(hosts)
    reqs = _requests(requests)
    loaded = _loaded(policy, sample)
    decisions = decide(snap, reqs, loaded, seed, breakdown=breakdown)
    assert sorted(d.index for d in decisions) == list(range(len(reqs)))
    _replay_holds(snap, loaded, decisions)
    again = decide(snap, reqs, loaded, seed, breakdown=not breakdown)
    # Same seed, same hosts: a dry run (breakdown) shows what the real run takes.
    assert [(d.index, d.host) for d in again] == [(d.index, d.host) for d in decisions]
    for decision in (*decisions, *again):
        if decision.scores:
            assert decision.scores[0].host == snap.names[decision.host or 0]


def test_a_mass_start_is_decided_in_rounds_and_spreads_as_one_at_a_time(
    alone: list[int],
) -> None:
    """400 VMs on 2,000 hosts with a sample of 20: most decided in rounds (few of their
    chosen hosts were taken earlier in the round), every one valid, and the spread as
    even as deciding one at a time."""
    rng = np.random.default_rng(5)
    hosts = [
        SyntheticHost(f"h{i}", {"VCPU": int(rng.choice([16, 32])), "MEMORY_MB": 65536})
        for i in range(2000)
    ]
    snap = Snapshot.of(hosts, {"anti": {}})
    reqs = [
        VmRequest(
            f"v{i}",
            f"v{i}",
            f"c{2 ** (i % 3)}",
            {"VCPU": 2 ** (i % 3), "MEMORY_MB": 1024 * 2 ** (i % 3)},
            group=GROUPS["anti"] if i < 100 else None,
        )
        for i in range(400)
    ]
    loaded = _loaded("spread", 20)
    rounds = decide(snap, reqs, loaded, seed=11)
    assert all(d.host is not None for d in rounds)
    assert alone[0] < len(reqs) // 4
    _replay_holds(snap, loaded, rounds)
    anti = [d.host for d in rounds if d.request.group is not None]
    assert len(set(anti)) == len(anti) == 100

    def spread(decisions: list[Decision]) -> float:
        used = np.zeros(len(hosts))
        for d in decisions:
            assert d.host is not None
            used[d.host] += d.request.resources["VCPU"]
        capacity = np.array([h.capacity["VCPU"] for h in hosts])
        return float((used / capacity).std())

    single = decide(snap, reqs, loaded, seed=11, rounds=False)
    assert spread(rounds) <= spread(single) * 1.25


def test_a_mass_start_in_rounds_lands_within_capacity_and_group_rules(
    lm: Loadmaster, alone: list[int]
) -> None:
    """Through the scheduler and the ledger: 600 VMs on 320 hosts of 2 slots each (a
    sample of 10 hosts, so rounds run until the hosts nearly fill), 100 of them in one
    anti-affinity group: all placed, none over capacity, no two members together, and
    the ledger's audit finds nothing."""
    add_hosts(lm, 320, vcpu=4, memory=8192)
    small_flavor(lm)
    lm.groups.create("apart", "anti-affinity")
    members = add_vms(lm, 100, group="apart")
    others = add_vms(lm, 500, prefix="free")
    spread = POLICIES["spread"]
    lm.scheduler.use_policies({"sampled": replace(spread, name="sampled", sample=10)})
    result = lm.scheduler.schedule([RequestSpec(vms=members + others)], policy="sampled")
    assert len(result.placed) == 600
    assert alone[0] < 300
    for usage in lm.allocations.usages().values():
        for used in usage.values():
            assert used.active + used.pending <= used.capacity
    hosts = [lm.vms.get(uuid).host for uuid in members]
    assert len(set(hosts)) == 100
    assert audit(lm.store) == []
