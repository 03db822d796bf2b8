"""An explanation and a run's failure say the same thing, in the group's terms when a hard
group rule is what leaves no host; a gang or group failing as one is one reason, counted."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

import loadmaster
from loadmaster.scheduler import RequestSpec, ScheduleResult
from loadmaster.service import Loadmaster


def _first_failure(result: ScheduleResult) -> str:
    explanations = [p.explanation for p in result.placements if p.explanation is not None]
    assert explanations, result.to_dict()
    return explanations[0].message


def test_an_affinity_group_one_too_big_names_the_best_host_and_its_limit(
    slm: Loadmaster,
) -> None:
    # Every host takes 13 VMs of 2 GiB by memory; h7 is the only one with room for 13.
    add_hosts(slm, 10, vcpu=64, memory=16384)
    add_hosts(slm, 1, prefix="h7-", vcpu=64, memory=13 * 2048)
    small_flavor(slm, vcpu=1, memory=2048)
    slm.groups.create("db", "affinity")
    uuids = add_vms(slm, 14, group="db")
    spec = RequestSpec(vms=uuids)
    expected = (
        "hard affinity group db needs 14 VMs on one host; the best host h7-0 fits 13 "
        "(limited by MEMORY_MB)"
    )
    explained = slm.scheduler.explain(spec)
    assert explained.message.startswith(expected), explained.message
    assert explained.candidates == 0
    result = slm.scheduler.schedule([spec])
    assert not result.placed
    assert _first_failure(result) == explained.message
    # Fourteen VMs kept out for one reason: said once, with the count.
    assert result.failure_reasons() == [
        {"code": "loadmaster.no_valid_host", "reason": explained.message, "vms": 14}
    ]


def test_an_anti_affinity_group_out_of_hosts_says_how_many_it_needs(slm: Loadmaster) -> None:
    add_hosts(slm, 5)
    small_flavor(slm)
    slm.groups.create("web", "anti-affinity")
    uuids = add_vms(slm, 8, group="web")
    spec = RequestSpec(vms=uuids)
    result = slm.scheduler.schedule([spec], dry_run=True, seed=3)
    assert len(result.placed) == 5
    message = _first_failure(result)
    assert message.startswith(
        "anti-affinity group web (at most 1 per host) needs 8 hosts for its 8 VMs; 0 are left: "
        "the 5 hosts that pass the other filters hold 1 already"
    ), message
    assert slm.scheduler.explain(spec, seed=3).message == message
    assert result.failure_reasons()[0]["vms"] == 3


def test_a_gang_failure_is_one_reason_per_cause_with_its_count(slm: Loadmaster) -> None:
    add_hosts(slm, 2, vcpu=4)
    small_flavor(slm)
    uuids = add_vms(slm, 30)
    result = slm.scheduler.schedule([RequestSpec(vms=uuids)], gang=True)
    reasons = result.to_dict()["failure_reasons"]
    assert isinstance(reasons, list) and len(reasons) == 2, reasons
    assert sorted(r["vms"] for r in reasons) == [1, 29]
    assert sum(r["vms"] for r in reasons) == len(result.failed) == 30


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    memories=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    members=st.integers(1, 14),
    group=st.sampled_from(
        [("affinity", None), ("anti-affinity", None), ("anti-affinity", 2), ("soft-affinity", 3)]
    ),
    maintenance=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_the_explanation_agrees_with_the_runs_failure(
    memories: list[int],
    members: int,
    group: tuple[str, int | None],
    maintenance: bool,
    seed: int,
) -> None:
    policy, cap = group
    with tempfile.TemporaryDirectory() as tmp:
        lm = loadmaster.open(f"sqlite:///{Path(tmp) / 'e.db'}")
        try:
            lm.hosts.create_many(
                [
                    {
                        "name": f"h{i}",
                        "state": "maintenance" if maintenance and i == 0 else "up",
                        "inventories": {
                            "VCPU": {"total": 64},
                            "MEMORY_MB": {"total": 1024 * m},
                        },
                    }
                    for i, m in enumerate(memories)
                ]
            )
            small_flavor(lm, vcpu=1, memory=1024)
            lm.groups.create("g", policy, max_per_host=cap)
            spec = RequestSpec(vms=add_vms(lm, members, group="g"))
            explained = lm.scheduler.explain(spec, seed=seed)
            dry = lm.scheduler.schedule([spec], dry_run=True, seed=seed)
            real = lm.scheduler.schedule([spec], seed=seed)
            assert real.placed == dry.placed
            if dry.ok:
                assert explained.candidates > 0
                return
            assert explained.candidates == 0
            assert _first_failure(dry) == _first_failure(real) == explained.message
            up = [m for i, m in enumerate(memories) if not (maintenance and i == 0)]
            if policy == "affinity" and members > 1 and up:
                fits = max(up)
                assert f"needs {members} VMs on one host" in explained.message
                assert f"fits {min(fits, members - 1)}" in explained.message
            elif (
                policy != "affinity"
                and up
                and len(up) * (cap or 1) < members
                and all(m >= (cap or 1) for m in up)
            ):
                # Out of hosts before out of memory: the group rule is the reason.
                hosts = -(-members // (cap or 1))
                assert f"needs {hosts} hosts for its {members} VMs; 0 are left" in (
                    explained.message
                )
        finally:
            lm.close()


def test_an_explanation_ranks_the_hosts_that_fit_with_each_weighers_part(
    slm: Loadmaster,
) -> None:
    add_hosts(slm, 3, vcpu=16, memory=16384)
    small_flavor(slm, vcpu=1, memory=2048)
    slm.allocations.claim(add_vms(slm, 1)[0], "h0")  # h0 is the fullest
    for policy, worst_first in (("spread", False), ("pack", True)):
        explained = slm.scheduler.explain(RequestSpec(flavor="small"), policy=policy)
        assert explained.candidates == 3
        ranking = explained.ranking
        assert [r.total for r in ranking] == sorted((r.total for r in ranking), reverse=True)
        assert (ranking[0].host == "h0") is worst_first, (policy, ranking)
        for row in ranking:
            assert abs(sum(row.by_weigher.values()) - row.total) < 1e-3
        assert explained.to_dict()["ranking"][0]["host"] == ranking[0].host
