"""Hosts with child providers (NUMA nodes, a GPU, NIC VFs): the scheduler decides as the
ledger claims, each class wholly on one provider of the tree, so it never picks a host
whose capacity is only there when summed across children."""

from __future__ import annotations

from collections import Counter

import pytest

from loadmaster.errors import ValidationError
from loadmaster.pending import audit
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster


@pytest.fixture
def numa(lm: Loadmaster) -> Loadmaster:
    """``numa``: two NUMA children of 4 VCPU each, memory on the root. ``big``: 8 VCPU on
    the root. ``gpu``: the root plus a GPU child holding 2 CUSTOM_GPU."""
    lm.resource_classes.create("CUSTOM_GPU", kind="accelerator")
    lm.hosts.create("numa", inventories={"MEMORY_MB": {"total": 65536}})
    for node in (0, 1):
        lm.hosts.create(f"numa-node{node}", parent="numa", inventories={"VCPU": {"total": 4}})
    lm.hosts.create("big", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 65536}})
    lm.hosts.create("gpu", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 65536}})
    lm.hosts.create("gpu-card", parent="gpu", inventories={"CUSTOM_GPU": {"total": 2}})
    lm.flavors.create({"name": "wide", "resources": {"VCPU": 6, "MEMORY_MB": 1024}})
    lm.flavors.create({"name": "narrow", "resources": {"VCPU": 4, "MEMORY_MB": 1024}})
    lm.flavors.create({"name": "ml", "resources": {"VCPU": 1, "MEMORY_MB": 1024, "CUSTOM_GPU": 1}})
    return lm


def test_a_class_is_never_split_across_children(numa: Loadmaster) -> None:
    lm = numa
    wide = lm.vms.create("wide", "wide").uuid
    # "numa" has 8 free VCPU in all but no child with 6: only the flat host "big" fits.
    explanation = lm.scheduler.explain(RequestSpec(vms=[wide]))
    assert explanation.candidates == 2  # big, and gpu (8 VCPU on its root)
    result = lm.scheduler.schedule([RequestSpec(vms=[wide])], policy="pack")
    assert result.placements[0].host in {"big", "gpu"}


def test_numa_children_fill_one_by_one_and_records_land_on_them(numa: Loadmaster) -> None:
    lm = numa
    narrow = [lm.vms.create(f"n{i}", "narrow").uuid for i in range(2)]
    result = lm.scheduler.schedule([RequestSpec(vms=[vm], include_hosts=["numa"]) for vm in narrow])
    assert [p.host for p in result.placements] == ["numa", "numa"]
    vcpu_on: Counter[str] = Counter()
    for r in lm.allocations.allocations():
        if r.resource_class == "VCPU":
            vcpu_on[r.host] += r.amount
    assert vcpu_on == {"numa-node0": 4, "numa-node1": 4}
    third = lm.vms.create("n2", "narrow").uuid
    result = lm.scheduler.schedule([RequestSpec(vms=[third], include_hosts=["numa"])])
    placement = result.placements[0]
    assert placement.host is None and placement.error is not None
    assert placement.error.code == "loadmaster.no_valid_host"
    assert audit(lm.store) == []


def test_child_resources_are_placed_and_counted(numa: Loadmaster) -> None:
    lm = numa
    jobs = [lm.vms.create(f"ml{i}", "ml").uuid for i in range(3)]
    result = lm.scheduler.schedule([RequestSpec(vms=jobs)])
    hosts = [p.host for p in result.placements]
    assert hosts[:2] == ["gpu", "gpu"] and hosts[2] is None
    gpu_records = [r for r in lm.allocations.allocations() if r.resource_class == "CUSTOM_GPU"]
    assert {r.host for r in gpu_records} == {"gpu-card"} and len(gpu_records) == 2
    usage = lm.allocations.usages(["gpu-card"])["gpu-card"]["CUSTOM_GPU"]
    assert (usage.capacity, usage.pending) == (2, 2)
    capacity = lm.scheduler.capacity("ml")
    assert capacity.total == 0
    lm.allocations.release(jobs[0])
    assert lm.scheduler.capacity("ml").total == 1
    assert audit(lm.store) == []


def test_drain_evacuate_and_a_pinned_start_refuse_a_child_provider_naming_its_root(
    numa: Loadmaster,
) -> None:
    """A child provider is no host to act on: each refusal says what to do instead, and
    names the child as stored whether it was named by name or uuid."""
    lm = numa
    child = next(h for h in lm.hosts.list() if h.name == "numa-node0")
    vm = lm.vms.create("v", "narrow").uuid
    refusals = {
        "drain its root host": lambda ident: lm.maintenance.drain(ident),
        "evacuate its root host": lambda ident: lm.evacuation.evacuate(ident, confirm_down=True),
        "name its root host": lambda ident: lm.scheduler.start(vm, host=ident),
    }
    for instead, act in refusals.items():
        for ident in ("numa-node0", child.uuid):
            with pytest.raises(ValidationError) as caught:
                act(ident)
            assert caught.value.detail == f"host numa-node0 is a child provider; {instead}"
            assert caught.value.field == "host"
    assert {v.state for v in lm.vms.list()} == {"requested"}
