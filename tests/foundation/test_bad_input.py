"""Every refused request names the field and the reason, and leaves the database as it was."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.foundation.dbstate import dump

from loadmaster.errors import LoadmasterError
from loadmaster.service import Loadmaster


@pytest.fixture
def seeded(lm: Loadmaster) -> Loadmaster:
    lm.resource_classes.create("CUSTOM_GPU", kind="accelerator", unit="gpu")
    lm.hosts.create(
        "h1",
        inventories={
            "VCPU": {"total": 8, "allocation_ratio": 2.0},
            "MEMORY_MB": {"total": 8192, "reserved": 1024, "step_size": 512},
            "CUSTOM_GPU": {"total": 1},
        },
    )
    lm.flavors.create({"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 2048}})
    lm.flavors.create({"name": "odd", "resources": {"VCPU": 1, "MEMORY_MB": 1000}})
    vm = lm.vms.create("vm1", "small")
    lm.allocations.claim(vm.uuid, "h1")
    lm.vms.create("vm2", "odd", uuid="00000000-0000-4000-8000-000000000002")
    return lm


UNKNOWN_VM = "11111111-1111-4111-8111-111111111111"

CASES: list[tuple[str, Callable[[Loadmaster], object], str, str]] = [
    (
        "negative total",
        lambda lm: lm.hosts.create("h2", inventories={"VCPU": {"total": -1}}),
        "inventories.VCPU.total",
        "at least 1",
    ),
    (
        "zero total",
        lambda lm: lm.hosts.set_inventory("h1", "DISK_GB", {"total": 0}),
        "inventories.DISK_GB.total",
        "at least 1",
    ),
    (
        "reserved above total",
        lambda lm: lm.hosts.set_inventory("h1", "DISK_GB", {"total": 10, "reserved": 20}),
        "inventories.DISK_GB.reserved",
        "greater than total",
    ),
    (
        "ratio zero",
        lambda lm: lm.hosts.create("h2", inventories={"VCPU": {"total": 4, "allocation_ratio": 0}}),
        "inventories.VCPU.allocation_ratio",
        "above 0",
    ),
    (
        "min above max",
        lambda lm: lm.hosts.set_inventories(
            "h1", {"VCPU": {"total": 8, "min_unit": 4, "max_unit": 2}}
        ),
        "inventories.VCPU.min_unit",
        "max_unit",
    ),
    (
        "unknown class in inventory",
        lambda lm: lm.hosts.create("h2", inventories={"CUSTOM_NOPE": {"total": 1}}),
        "inventories.CUSTOM_NOPE",
        "no such resource class",
    ),
    (
        "malformed custom class",
        lambda lm: lm.resource_classes.create("CUSTOM_lower"),
        "name",
        "CUSTOM_[A-Z0-9_]+",
    ),
    (
        "standard class as custom",
        lambda lm: lm.resource_classes.create("GPU"),
        "name",
        "CUSTOM_[A-Z0-9_]+",
    ),
    (
        "unknown host",
        lambda lm: lm.allocations.claim("00000000-0000-4000-8000-000000000002", "nope"),
        "host",
        "no such host",
    ),
    ("unknown VM", lambda lm: lm.allocations.claim(UNKNOWN_VM, "h1"), "vm", "no such VM"),
    ("unknown VM release", lambda lm: lm.allocations.release(UNKNOWN_VM), "vm", "no such VM"),
    (
        "amount not multiple of step",
        lambda lm: lm.allocations.claim("00000000-0000-4000-8000-000000000002", "h1"),
        "resources.MEMORY_MB",
        "step_size",
    ),
    ("unknown flavor", lambda lm: lm.vms.create("x", "nope"), "flavor", "no such flavor"),
    (
        "unknown class in flavor",
        lambda lm: lm.flavors.create({"name": "f", "resources": {"CUSTOM_NOPE": 1}}),
        "resources.CUSTOM_NOPE",
        "no such resource class",
    ),
    (
        "unknown trait in flavor",
        lambda lm: lm.flavors.create(
            {"name": "f", "resources": {"VCPU": 1}, "required_traits": ["CUSTOM_NOPE"]}
        ),
        "required_traits",
        "no such trait",
    ),
    *(
        (
            f"extra spec {key}",
            lambda lm, key=key, value=value: lm.flavors.create(
                {"name": "f", "resources": {"VCPU": 1}, "extra_specs": {key: value}}
            ),
            f"extra_specs.{key}",
            reason,
        )
        for key, value, reason in [
            ("hw:foo", "1", "not an extra spec loadmaster understands"),
            ("quota:cpu_shares", "ten", "must be an integer of at least 0"),
            ("quota:disk_total_bytes_sec", "-1", "must be an integer of at least 0"),
            ("quota:vif_inbound_average", "1.5", "must be an integer of at least 0"),
            ("quota:cpu_period", "10", "from 1000 to 1000000"),
            ("quota:cpu_limit", "10", "not a quota loadmaster applies"),
            ("quota:vif_outbound_peak", "10", "needs quota:vif_outbound_average"),
            ("quota:disk_read_iops_sec_max", "10", "needs extra_specs.quota:disk_read_iops_sec"),
            ("trait1:HW_CPU_X86_AVX2", "forbidden", "a request group's traits are required ones"),
            ("aggregate_instance_extra_specs:ssd", "true", "aggregates carry no metadata"),
            ("hw:numa_nodes", "2", "several NUMA nodes is not modelled"),
            ("hw:mem_page_size", "large", "huge pages are not tracked"),
            ("hw:cpu_policy", "mixed", "mixed policies are not modelled"),
            ("member_of", "in:", "must name aggregates"),
            ("resource:VCPU", "two", "must be an integer"),
            ("resources:CUSTOM_NOPE", "1", "no such resource class"),
            ("trait:CUSTOM_NOPE", "required", "no such trait"),
        ]
    ),
    (
        "bad unknown_specs",
        lambda lm: lm.flavors.create(
            {"name": "f", "resources": {"VCPU": 1}},
            unknown_specs="ignore",  # type: ignore[arg-type]
        ),
        "unknown_specs",
        "refuse or warn",
    ),
    ("bad host state", lambda lm: lm.hosts.set_state("h1", "sleeping"), "state", "one of"),
    (
        "shrink below allocated",
        lambda lm: lm.hosts.set_inventory("h1", "MEMORY_MB", {"total": 1024}),
        "inventories.MEMORY_MB",
        "below the 2048 allocated",
    ),
    (
        "remove class in use",
        lambda lm: lm.hosts.delete_inventory("h1", "VCPU"),
        "inventories.VCPU",
        "cannot remove",
    ),
    ("delete class in use", lambda lm: lm.resource_classes.delete("CUSTOM_GPU"), "name", "in use"),
    ("delete standard class", lambda lm: lm.resource_classes.delete("VCPU"), "name", "standard"),
    (
        "stale generation",
        lambda lm: lm.hosts.set_traits("h1", ["HW_CPU_X86_AVX2"], generation=0),
        "generation",
        "given: 0",
    ),
    ("bad tag", lambda lm: lm.vms.create("x", "small", tags=[""]), "tags[0]", "non-empty"),
    (
        "two tiers",
        lambda lm: lm.vms.create("x", "small", tags=["gold", "platinum"]),
        "tags",
        "more than one SLA tier",
    ),
    (
        "tier and its alias's other tier",
        lambda lm: lm.vms.create("x", "small", tags=["best-effort", "compute"]),
        "tags",
        "more than one SLA tier: compute, vapor",
    ),
    (
        "bad priority",
        lambda lm: lm.vms.create("x", "small", tags=["gold", "priority:high"]),
        "tags[1]",
        "priority:N",
    ),
    (
        "two priorities",
        lambda lm: lm.vms.create("x", "small", tags=["priority:1", "priority:2"]),
        "tags",
        "more than one priority",
    ),
    ("bad uuid", lambda lm: lm.vms.create("x", "small", uuid="not-a-uuid"), "uuid", "not a UUID"),
    ("duplicate host name", lambda lm: lm.hosts.create("h1"), "name", "already exists"),
    ("delete host with allocations", lambda lm: lm.hosts.delete("h1"), "host", "has allocations"),
    ("flavor in use", lambda lm: lm.flavors.delete("small"), "name", "used by"),
]


@pytest.mark.parametrize(("case", "call", "field", "reason"), CASES, ids=[c[0] for c in CASES])
def test_refused_and_unchanged(
    seeded: Loadmaster, case: str, call: Callable[[Loadmaster], object], field: str, reason: str
) -> None:
    before = dump(seeded)
    with pytest.raises(LoadmasterError) as err:
        call(seeded)
    assert err.value.field == field, err.value.detail
    assert reason in err.value.detail
    assert dump(seeded) == before


def test_batch_of_vms_is_all_or_nothing(seeded: Loadmaster) -> None:
    from loadmaster.cluster import VmSpec

    before = dump(seeded)
    with pytest.raises(LoadmasterError) as err:
        seeded.vms.create_many(
            [VmSpec("a", "small"), VmSpec("b", "small"), VmSpec("c", "no-such-flavor")]
        )
    assert err.value.field == "vms[2].flavor"
    assert dump(seeded) == before


def test_vapor_and_its_alias_with_a_priority_are_one_tier(seeded: Loadmaster) -> None:
    vm = seeded.vms.create("x", "small", tags=["vapor", "best-effort", "priority:7"])
    assert sorted(vm.tags) == ["best-effort", "priority:7", "vapor"]
