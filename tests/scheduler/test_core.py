"""The scheduling core with no database: every shipped filter and weigher, table-driven
over made-up snapshots (``Snapshot.of``), and ``decide``'s own promises."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from loadmaster.cluster.records import GroupRecord
from loadmaster.errors import PluginFailed
from loadmaster.scheduler.core import LoadedPolicy, Snapshot, SyntheticHost, VmRequest, decide
from loadmaster.scheduler.core.decide import filter_hosts
from loadmaster.scheduler.core.plugins import LoadedFilter, Verdict, load_filters, load_weighers
from loadmaster.scheduler.core.policies import POLICIES
from loadmaster.scheduler.core.questions import capacity, explain

SMALL = {"VCPU": 1, "MEMORY_MB": 512}
BIG_HOST = {"VCPU": 16, "MEMORY_MB": 65536}


def host(name: str, **kw: object) -> SyntheticHost:
    kw.setdefault("capacity", BIG_HOST)
    return SyntheticHost(name, **kw)  # type: ignore[arg-type]


def request(resources: Mapping[str, int] = SMALL, **kw: object) -> VmRequest:
    return VmRequest("vm", "vm", "f", dict(resources), **kw)  # type: ignore[arg-type]


def group(policy: str, max_per_host: int | None = None) -> GroupRecord:
    return GroupRecord("g-uuid", "g", policy, max_per_host)


def loaded(policy: str = "spread", **kw: object) -> LoadedPolicy:
    chosen = POLICIES[policy]
    return LoadedPolicy(policy, tuple(load_filters()), tuple(load_weighers(chosen.weighers)), **kw)  # type: ignore[arg-type]


FILTER_CASES = [
    # (case, hosts, group members, request, kept, {filter: {reason: hosts}})
    (
        "resources count what is used",
        [host("a", used={"VCPU": 16}), host("b")],
        None,
        request(),
        {"b"},
        {"resources": {"short of VCPU": 1}},
    ),
    (
        "a class the host lacks is named",
        [host("a"), host("gpu", capacity={**BIG_HOST, "CUSTOM_GPU": 1})],
        None,
        request({"VCPU": 1, "CUSTOM_GPU": 1}),
        {"gpu"},
        {"resources": {"no CUSTOM_GPU inventory": 1}},
    ),
    (
        "unit rules: step 2 refuses an odd amount",
        [host("a", units={"VCPU": (1, 16, 2)}), host("b")],
        None,
        request({"VCPU": 3}),
        {"b"},
        {"resources": {"short of VCPU": 1}},
    ),
    (
        "maintenance and down hosts are out",
        [host("a", state="maintenance"), host("b", state="down"), host("c")],
        None,
        request(),
        {"c"},
        {"host_state": {"maintenance": 1, "down": 1}},
    ),
    (
        "required and forbidden traits, anywhere in the tree",
        [
            host("a"),
            host("b", traits=["HW_CPU_X86_AVX2"]),
            host("c", children=[SyntheticHost("c-numa0", traits=["HW_CPU_X86_AVX2"])]),
            host("d", traits=["HW_CPU_X86_AVX2", "CUSTOM_SLOW"]),
        ],
        None,
        request(
            required_traits=frozenset({"HW_CPU_X86_AVX2"}),
            forbidden_traits=frozenset({"CUSTOM_SLOW"}),
        ),
        {"b", "c"},
        {"traits": {"missing trait HW_CPU_X86_AVX2": 1, "has forbidden trait CUSTOM_SLOW": 1}},
    ),
    (
        "member_of: each list any-of, lists AND-ed; forbidden aggregates",
        [
            host("a", aggregates=["rack1", "ssd"]),
            host("b", aggregates=["rack2", "ssd"]),
            host("c", aggregates=["rack1"]),
            host("d", aggregates=["rack2", "ssd", "quarantine"]),
        ],
        None,
        request(
            member_of=(frozenset({"rack1", "rack2"}), frozenset({"ssd"})),
            forbidden_aggregates=frozenset({"quarantine"}),
        ),
        {"a", "b"},
        {"aggregates": {"not in aggregate ssd": 1, "in forbidden aggregate quarantine": 1}},
    ),
    (
        "include and exclude hosts",
        [host("a"), host("b"), host("c")],
        None,
        request(include_hosts=frozenset({"a", "b"}), exclude_hosts=frozenset({"a"})),
        {"b"},
        {
            "hosts": {
                "not a host asked for": 1,
                "excluded (where the VM runs, or by the request)": 1,
            }
        },
    ),
    (
        "hard affinity follows the placed member",
        [host("a"), host("b")],
        {"b": 1},
        request(group=group("affinity")),
        {"b"},
        {"affinity": {"affinity(group g)": 1}},
    ),
    (
        "hard anti-affinity: one member per host by default",
        [host("a"), host("b")],
        {"a": 1},
        request(group=group("anti-affinity")),
        {"b"},
        {"anti_affinity": {"anti-affinity(group g)": 1}},
    ),
    (
        "anti-affinity with max_per_host 2",
        [host("a"), host("b")],
        {"a": 2, "b": 1},
        request(group=group("anti-affinity", 2)),
        {"b"},
        {"anti_affinity": {"anti-affinity(group g)": 1}},
    ),
    (
        "a soft group's max_per_host is still a cap",
        [host("a"), host("b")],
        {"a": 3},
        request(group=group("soft-affinity", 3)),
        {"b"},
        {"max_per_host": {"max-per-host(group g: 3)": 1}},
    ),
    (
        "a hard-affinity group's companions must fit with the first member",
        [host("a", capacity={"VCPU": 2, "MEMORY_MB": 65536}), host("b")],
        None,
        request(group=group("affinity"), companions=(SMALL, SMALL)),
        {"b"},
        {"resources": {"short of VCPU": 1}},
    ),
]


@pytest.mark.parametrize(
    ("hosts", "members", "req", "kept", "reasons"),
    [case[1:] for case in FILTER_CASES],
    ids=[case[0] for case in FILTER_CASES],
)
def test_filters(
    hosts: list[SyntheticHost],
    members: dict[str, int] | None,
    req: VmRequest,
    kept: set[str],
    reasons: dict[str, dict[str, int]],
) -> None:
    snap = Snapshot.of(hosts, {"g": members or {}})
    _, keep = filter_hosts(snap, req, loaded())
    assert {snap.names[h] for h in np.flatnonzero(keep)} == kept
    blamed = explain(snap, req, loaded()).filters
    assert {f.filter: f.reasons for f in blamed} == reasons


def _weights(weigher: str, snap: Snapshot, req: VmRequest, **options: object) -> list[float]:
    from loadmaster.scheduler.core.plugins import WeigherSetting

    [(loaded, _)] = load_weighers([WeigherSetting(weigher, 1.0, options)])
    raw = loaded.weigh(snap, req, np.arange(snap.size))
    assert raw is not None
    return [round(float(x), 4) for x in raw]


WEIGHER_CASES = [
    # (case, weigher, options, hosts, members, request, raw scores per host)
    (
        "spread: the emptiest after placing, per class, normalised",
        "spread",
        {},
        [host("a", used={"VCPU": 8}), host("b", capacity={"VCPU": 32, "MEMORY_MB": 65536})],
        None,
        request({"VCPU": 8}),
        [0.0, 0.75],
    ),
    (
        "pack: the fullest after placing, weighted classes",
        "pack",
        {"classes": {"MEMORY_MB": 1.0}},
        [host("a"), host("b", capacity={"VCPU": 16, "MEMORY_MB": 16384})],
        None,
        request({"VCPU": 2, "MEMORY_MB": 4096}),
        [0.0625, 0.25],
    ),
    (
        "balance: classes filled evenly",
        "balance",
        {},
        [
            host("cpu", capacity={"VCPU": 8, "MEMORY_MB": 65536}),
            host("even", capacity={"VCPU": 8, "MEMORY_MB": 16384}),
        ],
        None,
        request({"VCPU": 2, "MEMORY_MB": 4096}),
        [-0.1875, 0.0],
    ),
    (
        "vm count: fewer VMs, whatever their size",
        "vm_count",
        {},
        [host("a", vm_count=3), host("b", vm_count=1)],
        None,
        request(),
        [-3.0, -1.0],
    ),
    (
        "measured load: an unknown load counts as average",
        "load",
        {},
        [host("a", load=0.9), host("b", load=0.1), host("c")],
        None,
        request(),
        [-0.9, -0.1, -0.5],
    ),
    (
        "soft affinity: towards the group's members",
        "soft_affinity",
        {},
        [host("a"), host("b")],
        {"a": 2},
        request(group=group("soft-affinity")),
        [2.0, 0.0],
    ),
    (
        "soft anti-affinity: away from them",
        "soft_anti_affinity",
        {},
        [host("a"), host("b")],
        {"a": 2},
        request(group=group("soft-anti-affinity")),
        [-2.0, 0.0],
    ),
]


@pytest.mark.parametrize(
    ("weigher", "options", "hosts", "members", "req", "expected"),
    [case[1:] for case in WEIGHER_CASES],
    ids=[case[0] for case in WEIGHER_CASES],
)
def test_weighers(
    weigher: str,
    options: dict[str, object],
    hosts: list[SyntheticHost],
    members: dict[str, int] | None,
    req: VmRequest,
    expected: list[float],
) -> None:
    snap = Snapshot.of(hosts, {"g": members or {}})
    assert _weights(weigher, snap, req, **options) == pytest.approx(expected)


def _arrays(snap: Snapshot) -> dict[str, list[object]]:
    return {
        "used": snap.used.tolist(),
        "host_used": snap.host_used.tolist(),
        "vm_count": snap.vm_count.tolist(),
        "groups": [c.tolist() for c in snap.group_members.values()],
    }


def test_decide_sees_its_own_decisions_and_leaves_the_snapshot_alone() -> None:
    snap = Snapshot.of(
        [host("a", capacity={"VCPU": 2}), host("b", capacity={"VCPU": 2})], {"g": {}}
    )
    before = _arrays(snap)
    reqs = [request({"VCPU": 1}, group=group("anti-affinity")) for _ in range(3)]
    reqs = [replace(r, vm=f"v{i}", label=f"v{i}") for i, r in enumerate(reqs)]
    decisions = decide(snap, reqs, loaded(), seed=7)
    hosts = [d.host for d in decisions]
    assert sorted(h for h in hosts if h is not None) == [0, 1]  # one per host
    failed = [d for d in decisions if d.error is not None]
    assert len(failed) == 1 and "anti-affinity" in str(failed[0].error)
    assert _arrays(snap) == before
    with pytest.raises(ValueError, match="read-only"):
        snap.used[0, 0] = 99


def test_the_same_seed_makes_the_same_choices_and_another_seed_can_differ() -> None:
    snap = Snapshot.of([host(f"h{i}") for i in range(50)])
    reqs = [replace(request(), vm=f"v{i}", label=f"v{i}") for i in range(20)]
    first = [d.host for d in decide(snap, reqs, loaded(), seed=1)]
    assert [d.host for d in decide(snap, reqs, loaded(), seed=1)] == first
    assert any([d.host for d in decide(snap, reqs, loaded(), seed=s)] != first for s in range(2, 6))


def test_all_or_nothing_stops_at_the_first_misfit() -> None:
    snap = Snapshot.of([host("a", capacity={"VCPU": 1})])
    reqs = [replace(request({"VCPU": 1}), vm=f"v{i}", label=f"v{i}") for i in range(4)]
    decisions = decide(snap, reqs, loaded(), seed=0, all_or_nothing=True)
    assert [d.host for d in decisions] == [0, None]


def test_a_hard_affinity_group_lands_together_or_not_at_all() -> None:
    snap = Snapshot.of(
        [host("small", capacity={"VCPU": 2}), host("big", capacity={"VCPU": 3})], {"g": {}}
    )
    members = [
        replace(request({"VCPU": 1}, group=group("affinity")), label=f"m{i}") for i in range(3)
    ]
    decisions = decide(snap, members, loaded(), seed=3)
    assert {d.host for d in decisions} == {1}
    four = [*members, replace(members[0], label="m3")]
    decisions = decide(snap, four, loaded(), seed=3)
    assert all(d.error is not None for d in decisions)
    assert "needs 4 VMs on one host; the best host big fits 3" in str(decisions[-1].error)


def test_breakdown_gives_the_chosen_host_and_runners_up_per_weigher() -> None:
    snap = Snapshot.of([host("a", used={"VCPU": 8}), host("b"), host("c", used={"VCPU": 4})])
    [decision] = decide(snap, [request()], loaded("pack"), seed=0, breakdown=True)
    assert decision.host is not None
    chosen, *others = decision.scores
    assert chosen.host == snap.names[decision.host] == "a"
    assert [s.host for s in others] == ["c", "b"]
    assert set(chosen.by_weigher) <= {"pack", "balance"} and chosen.total >= others[0].total


def test_capacity_counts_copies_per_host_within_group_caps() -> None:
    snap = Snapshot.of(
        [host("a", capacity={"VCPU": 4}), host("b", capacity={"VCPU": 8}), host("c", state="down")],
        {"g": {"b": 1}},
    )
    report = capacity(snap, request({"VCPU": 2}), loaded(), "f", None)
    assert report.total == 6 and report.per_host == {"b": 4, "a": 2}
    capped = capacity(
        snap, request({"VCPU": 2}, group=group("anti-affinity", 3)), loaded(), "f", "g"
    )
    assert capped.per_host == {"a": 2, "b": 2} and capped.limits == {"c": "down"}


class _Greedy:
    """A static filter that declares it reads only the traits, and reads the resources."""

    name = "greedy"

    def mask(self, hosts: Snapshot, req: VmRequest) -> Verdict | None:
        req.resources  # noqa: B018 -- the read is the point
        return None


def test_a_static_filter_reading_what_it_did_not_declare_fails_naming_itself() -> None:
    greedy = LoadedFilter("greedy", _Greedy(), None, False, 1, frozenset({"required_traits"}))
    snap = Snapshot.of([host("a")])
    [decision] = decide(snap, [request()], LoadedPolicy("p", (greedy,)), seed=0)
    assert isinstance(decision.error, PluginFailed)
    assert "'greedy'" in str(decision.error) and "request.resources" in str(decision.error)


def test_static_verdicts_are_cached_per_declared_fields() -> None:
    calls: list[frozenset[str]] = []

    class Counting:
        name = "counting"

        def mask(self, hosts: Snapshot, req: VmRequest) -> Verdict | None:
            calls.append(req.required_traits)
            return None

    counting = LoadedFilter("counting", Counting(), None, False, 1, frozenset({"required_traits"}))
    snap = Snapshot.of([host("a"), host("b")])
    avx = frozenset({"HW_CPU_X86_AVX2"})
    reqs = [request(), request({"VCPU": 2}), request(required_traits=avx), request()]
    decide(snap, reqs, LoadedPolicy("p", (counting,)), seed=0)
    assert calls == [frozenset(), avx]
