"""Batches: pending claims of a batch count for the next decision; gang and best effort."""

from __future__ import annotations

from collections import Counter

from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster.errors import NoValidHost
from loadmaster.scheduler import NoHostFits, RequestSpec
from loadmaster.service import Loadmaster


def test_anti_affine_mass_start_never_doubles_up(lm: Loadmaster) -> None:
    add_hosts(lm, 60, vcpu=64, memory=65536)
    small_flavor(lm, vcpu=1, memory=256)
    lm.groups.create("web", "anti-affinity")
    vms = add_vms(lm, 80, group="web")
    result = lm.scheduler.schedule([RequestSpec(vms=vms)], policy="pack")
    assert len(result.placed) == 60
    assert max(Counter(vm.host for vm in lm.groups.members("web") if vm.host).values()) == 1
    assert all(isinstance(p.error, NoValidHost) for p in result.failed)
    assert all(vm.state in ("pending", "requested") for vm in lm.groups.members("web"))


def test_hard_affinity_group_lands_together_or_not_at_all(slm: Loadmaster) -> None:
    add_hosts(slm, 6, vcpu=8)
    small_flavor(slm, vcpu=2, memory=1024)
    slm.groups.create("pair", "affinity")
    slm.groups.create("crowd", "affinity")
    loners = add_vms(slm, 10, prefix="x")
    pair = add_vms(slm, 4, group="pair", prefix="p")  # 8 VCPU: exactly one empty host
    crowd = add_vms(slm, 5, group="crowd", prefix="c")  # 10 VCPU: no host can hold it
    spec = RequestSpec(vms=[*loners[:3], pair[0], *loners[3:], *pair[1:], *crowd])
    result = slm.scheduler.schedule([spec], policy="spread")
    by_vm = {p.vm: p for p in result.placements}
    assert len({by_vm[v].host for v in pair}) == 1 and by_vm[pair[0]].host is not None
    assert all(by_vm[v].host is None for v in crowd)
    assert all(isinstance(by_vm[v].error, NoHostFits) for v in crowd)
    assert [p.vm for p in result.placements] == spec.vms  # answers in the asked order


def test_gang_rollback_leaves_no_record(lm: Loadmaster) -> None:
    add_hosts(lm, 3, vcpu=4)
    small_flavor(lm)
    vms = add_vms(lm, 7)  # room for 6
    before = {v.uuid: (v.state, v.generation) for v in lm.vms.list()}
    generations = {h.name: h.generation for h in lm.hosts.list()}
    result = lm.scheduler.schedule([RequestSpec(vms=vms)], gang=True)
    assert not result.placed and len(result.failed) == 7
    assert sum(isinstance(p.error, NoHostFits) for p in result.placements) == 1
    assert lm.allocations.allocations() == []
    assert {v.uuid: (v.state, v.generation) for v in lm.vms.list()} == before
    assert {h.name: h.generation for h in lm.hosts.list()} == generations
    ok = lm.scheduler.schedule([RequestSpec(vms=vms[:6])], gang=True)
    assert ok.ok and len(lm.allocations.allocations()) == 12


def test_best_effort_reports_each_vm(slm: Loadmaster) -> None:
    add_hosts(slm, 2, vcpu=4)
    small_flavor(slm)
    vms = add_vms(slm, 6)
    result = slm.scheduler.schedule([RequestSpec(vms=vms)])
    assert len(result.placed) == 4 and len(result.failed) == 2
    body = result.to_dict()
    assert (
        body["placed"] == 4 and body["placements"][5]["error"]["code"] == "loadmaster.no_valid_host"
    )
    assert "explanation" in body["placements"][5]["error"]


def test_explanation_counts_add_up_to_the_host_count(slm: Loadmaster) -> None:
    add_hosts(slm, 20, vcpu=4)
    add_hosts(slm, 5, prefix="m", vcpu=4)
    add_hosts(slm, 5, prefix="t", vcpu=64, traits=["STORAGE_DISK_HDD"])
    for name in ("m0", "m1", "m2"):
        slm.hosts.set_state(name, "maintenance")
    small_flavor(slm, vcpu=8, memory=1024)
    slm.groups.create("web", "anti-affinity")
    placed = slm.scheduler.schedule(
        [RequestSpec(vms=add_vms(slm, 2, group="web"), forbidden_traits=["STORAGE_DISK_SSD"])]
    )
    assert placed.ok
    explanation = slm.scheduler.explain(
        RequestSpec(flavor="small", group="web", forbidden_traits=["STORAGE_DISK_HDD"])
    )
    assert explanation.candidates == 0
    assert sum(f.removed for f in explanation.filters) == explanation.hosts == 30
    assert sum(sum(f.reasons.values()) for f in explanation.filters) == 30
    assert explanation.message.startswith("no host fits: 30 hosts; 22 short of VCPU")
    assert "5 has forbidden trait STORAGE_DISK_HDD" in explanation.message
    assert "3 maintenance" in explanation.message


def test_dry_run_decides_without_claiming(slm: Loadmaster) -> None:
    add_hosts(slm, 4, vcpu=4)
    small_flavor(slm)
    vms = add_vms(slm, 8)
    dry = slm.scheduler.schedule([RequestSpec(vms=vms)], dry_run=True)
    assert dry.ok and Counter(p.host for p in dry.placements) == dict.fromkeys(
        ["h0", "h1", "h2", "h3"], 2
    )
    assert slm.allocations.allocations() == []
    assert {v.state for v in slm.vms.list()} == {"requested"}
    again = slm.scheduler.schedule([RequestSpec(flavor="small", count=9)], dry_run=True)
    assert len(again.placed) == 8  # the dry run left nothing behind in memory either


def test_capacity_counts_per_host_with_groups(slm: Loadmaster) -> None:
    add_hosts(slm, 3, vcpu=8, memory=8192)
    slm.hosts.set_state("h2", "maintenance")
    small_flavor(slm, vcpu=2, memory=2048)
    slm.allocations.claim(add_vms(slm, 1)[0], "h0")
    report = slm.scheduler.capacity("small")
    assert report.total == 7 and report.per_host == {"h1": 4, "h0": 3}
    slm.groups.create("web", "anti-affinity", max_per_host=2)
    assert slm.scheduler.capacity("small", group="web").total == 4
    slm.groups.create("db", "affinity")
    assert slm.scheduler.capacity("small", group="db").total == 4
    assert report.to_dict()["per_host"] == {"h1": 4, "h0": 3}
    small_flavor(slm, "huge", vcpu=64, memory=2048)
    nowhere = slm.scheduler.capacity("huge")  # raised ValueError (min of no scores) before
    assert nowhere.total == 0 and nowhere.per_host == {}
