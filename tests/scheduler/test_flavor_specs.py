"""A flavor's extra specs are applied where VMs are placed: member_of keeps its VMs in (or
out of) aggregates, resource:/resources: give their amounts, pinned CPUs ask PCPU."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.scheduler.conftest import add_hosts

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.cluster.catalog import FlavorService
from loadmaster.errors import InsufficientCapacity, ValidationError
from loadmaster.pending import audit
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster
from loadmaster.settings import env_name

UNKNOWN_SPECS_ENV = env_name("unknown_specs")


def test_member_of_in_extra_specs_keeps_the_flavors_vms_in_the_aggregate(
    slm: Loadmaster,
) -> None:
    add_hosts(slm, 6)
    add_hosts(slm, 2, prefix="ssd", aggregates=["fast"])
    slm.flavors.create(
        {"name": "in-fast", "extra_specs": {"resource:VCPU": "1", "member_of": "in:fast"}}
    )
    slm.flavors.create(
        {"name": "not-fast", "extra_specs": {"resources:VCPU": "1", "member_of": "!fast"}}
    )
    inside = slm.scheduler.schedule([RequestSpec(flavor="in-fast", count=10)], dry_run=True)
    assert set(inside.placed.values()) == {"ssd0", "ssd1"}
    outside = slm.scheduler.capacity("not-fast")
    assert outside.per_host and not {"ssd0", "ssd1"} & set(outside.per_host)
    explained = slm.scheduler.explain(RequestSpec(flavor="in-fast"))
    assert explained.candidates == 2
    assert {"not in aggregate fast": 6} in [f.reasons for f in explained.filters]


def test_dedicated_cpus_are_placed_as_pcpu(slm: Loadmaster) -> None:
    add_hosts(slm, 2)
    add_hosts(slm, 1, prefix="pinned", extra={"PCPU": {"total": 4}})
    slm.flavors.create(
        {"name": "pin", "resources": {"VCPU": 2}, "extra_specs": {"hw:cpu_policy": "dedicated"}}
    )
    assert slm.flavors.get("pin").resources == {"PCPU": 2}
    result = slm.scheduler.schedule([RequestSpec(flavor="pin", count=3)], dry_run=True)
    assert [p.host for p in result.placements] == ["pinned0", "pinned0", None]


def test_the_servers_setting_decides_for_unknown_specs_unless_the_call_does(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    definition = {"name": "f", "resources": {"VCPU": 1}, "extra_specs": {"hw:foo": "1"}}
    monkeypatch.setenv(UNKNOWN_SPECS_ENV, "warn")
    warned = Loadmaster(slm.store).flavors.create(dict(definition))
    assert warned.warnings == ("extra_specs.hw:foo is not understood and is ignored",)
    with pytest.raises(ValidationError) as err:
        FlavorService(slm.store, "warn").create({**definition, "name": "g"}, unknown_specs="refuse")
    assert err.value.field == "extra_specs.hw:foo"
    assert [f.name for f in slm.flavors.list()] == ["f"]
    monkeypatch.setenv(UNKNOWN_SPECS_ENV, "ignore")
    with pytest.raises(ValidationError) as err:
        Loadmaster(slm.store)
    assert err.value.field == "unknown_specs" and UNKNOWN_SPECS_ENV in err.value.detail


def test_one_numa_node_keeps_a_vms_node_classes_on_one_node(slm: Loadmaster) -> None:
    lm = slm
    # "skew" has room for the VM only with its CPUs on one node and memory on the other;
    # "even" has two nodes each with room for two VMs.
    for host, nodes in (("skew", ((4, 1024), (1, 8192))), ("even", ((4, 4096), (4, 4096)))):
        lm.hosts.create(host, inventories={"DISK_GB": {"total": 100}})
        for n, (vcpu, memory) in enumerate(nodes):
            lm.hosts.create(
                f"{host}-node{n}",
                parent=host,
                inventories={"VCPU": {"total": vcpu}, "MEMORY_MB": {"total": memory}},
            )
    resources = {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10}
    lm.flavors.create({"name": "split", "resources": resources})
    lm.flavors.create(
        {"name": "one-node", "resources": resources, "extra_specs": {"hw:numa_nodes": "1"}}
    )
    assert lm.scheduler.capacity("split").per_host == {"even": 4, "skew": 2}
    pinned = lm.scheduler.capacity("one-node")
    assert pinned.per_host == {"even": 4}
    assert pinned.limits == {"skew": "no NUMA node with room for all"}

    vm = lm.vms.create("direct", "one-node").uuid
    with pytest.raises(InsufficientCapacity) as err:
        lm.allocations.claim(vm, "skew")
    assert "on one NUMA node" in err.value.detail
    uuids = [vm] + [lm.vms.create(f"n{i}", "one-node").uuid for i in range(4)]
    result = lm.scheduler.schedule([RequestSpec(vms=uuids)])
    assert sorted(p.host or "-" for p in result.placements) == ["-", "even", "even", "even", "even"]
    nodes: dict[str, set[str]] = {}
    for record in lm.allocations.allocations():
        if record.resource_class != "DISK_GB":
            nodes.setdefault(record.vm, set()).add(record.host)
    assert len(nodes) == 4 and all(len(hosts) == 1 for hosts in nodes.values()), nodes
    assert audit(lm.store) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # per host, its NUMA nodes as (VCPU, GiB of memory); none for a flat host
    hosts=st.lists(
        st.lists(st.tuples(st.integers(1, 8), st.integers(1, 8)), max_size=3),
        min_size=1,
        max_size=4,
    ),
    vms=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=20),
)
def test_one_numa_node_the_scheduler_decides_as_the_ledger_claims(
    hosts: list[list[tuple[int, int]]], vms: list[str]
) -> None:
    """The ledger never refuses what the scheduler chose for a hw:numa_nodes=1 flavor, and
    capacity counted before the batch is what the batch places."""
    with tempfile.TemporaryDirectory() as tmp:
        lm = loadmaster.open(f"sqlite:///{Path(tmp) / 'numa.db'}")
        try:
            for i, nodes in enumerate(hosts):
                flat = {"VCPU": {"total": 4}, "MEMORY_MB": {"total": 4096}}
                lm.hosts.create(f"h{i}", inventories={} if nodes else flat)
                for j, (vcpu, gib) in enumerate(nodes):
                    lm.hosts.create(
                        f"h{i}-n{j}",
                        parent=f"h{i}",
                        inventories={"VCPU": {"total": vcpu}, "MEMORY_MB": {"total": gib * 1024}},
                    )
            for name, vcpu, gib in (("a", 1, 1), ("b", 2, 3), ("c", 3, 1)):
                lm.flavors.create(
                    {
                        "name": name,
                        "resources": {"VCPU": vcpu, "MEMORY_MB": gib * 1024},
                        "extra_specs": {"hw:numa_nodes": "1"},
                    }
                )
            room = lm.scheduler.capacity(vms[0]).total
            uuids = [
                v.uuid for v in lm.vms.create_many([VmSpec(f"v{i}", f) for i, f in enumerate(vms)])
            ]
            result = lm.scheduler.schedule([RequestSpec(vms=uuids)], policy="pack")
            assert result.conflicts == 0
            assert all(p.attempts == 1 for p in result.placements)
            assert audit(lm.store) == []
            on: dict[str, set[str]] = {}
            for record in lm.allocations.allocations():
                on.setdefault(record.vm, set()).add(record.host)
            assert all(len(providers) == 1 for providers in on.values()), on
            if len(set(vms)) == 1:
                assert len(result.placed) == min(room, len(vms))
        finally:
            lm.close()
