"""Every shipped filter end to end: through schedule / explain on a small SQLite cluster.
The table-driven tests of each filter, on synthetic snapshots with no database, are in
``test_core.py``."""

from __future__ import annotations

from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster


def _hosts_of(lm: Loadmaster, spec: RequestSpec) -> set[str]:
    result = lm.scheduler.schedule([spec], dry_run=True)
    return {p.host for p in result.placements if p.host}


def test_resources_count_pending_as_used(slm: Loadmaster) -> None:
    add_hosts(slm, 2, vcpu=4)
    small_flavor(slm)
    first, second = add_vms(slm, 2)
    slm.allocations.claim(first, "h0")  # pending, not started
    slm.allocations.claim(second, "h0")
    explanation = slm.scheduler.explain(RequestSpec(flavor="small"))
    assert explanation.candidates == 1
    assert explanation.filters[0].reasons == {"short of VCPU": 1}


def test_resources_name_the_missing_inventory(slm: Loadmaster) -> None:
    slm.resource_classes.create("CUSTOM_GPU")
    add_hosts(slm, 3)
    add_hosts(slm, 1, prefix="gpu", extra={"CUSTOM_GPU": {"total": 1}})
    slm.flavors.create({"name": "g", "resources": {"VCPU": 1, "CUSTOM_GPU": 1}})
    assert _hosts_of(slm, RequestSpec(flavor="g")) == {"gpu0"}
    message = slm.scheduler.explain(RequestSpec(flavor="g", count=1)).message
    assert "3 no CUSTOM_GPU inventory" in message


def test_one_vm_of_a_kind_per_host_is_a_custom_class(slm: Loadmaster) -> None:
    slm.resource_classes.create("CUSTOM_ONE_PER_HOST")
    add_hosts(slm, 3, extra={"CUSTOM_ONE_PER_HOST": {"total": 1}})
    slm.flavors.create(
        {"name": "db", "resources": {"VCPU": 1, "MEMORY_MB": 512, "CUSTOM_ONE_PER_HOST": 1}}
    )
    vms = add_vms(slm, 4, "db")
    result = slm.scheduler.schedule([RequestSpec(vms=vms)])
    hosts = [p.host for p in result.placements if p.host]
    assert sorted(hosts) == ["h0", "h1", "h2"]
    assert "3 short of CUSTOM_ONE_PER_HOST" in str(result.failed[0].error)


def test_host_state_keeps_maintenance_and_down_out(slm: Loadmaster) -> None:
    add_hosts(slm, 3)
    small_flavor(slm)
    slm.hosts.set_state("h0", "maintenance")
    slm.hosts.set_state("h1", "down")
    assert _hosts_of(slm, RequestSpec(flavor="small", count=3)) == {"h2"}
    slm.hosts.set_state("h2", "maintenance")
    explanation = slm.scheduler.explain(RequestSpec(flavor="small"))
    assert explanation.filters[0].reasons == {"maintenance": 2, "down": 1}


def test_traits_required_and_forbidden(slm: Loadmaster) -> None:
    add_hosts(slm, 2, prefix="avx", traits=["HW_CPU_X86_AVX2"])
    add_hosts(slm, 2, prefix="ssd", traits=["HW_CPU_X86_AVX2", "STORAGE_DISK_SSD"])
    add_hosts(slm, 1, prefix="plain")
    slm.flavors.create(
        {
            "name": "avx",
            "resources": {"VCPU": 1},
            "extra_specs": {"trait:HW_CPU_X86_AVX2": "required"},
        }
    )
    assert _hosts_of(slm, RequestSpec(flavor="avx", count=20)) == {"avx0", "avx1", "ssd0", "ssd1"}
    spec = RequestSpec(flavor="avx", count=20, forbidden_traits=["STORAGE_DISK_SSD"])
    assert _hosts_of(slm, spec) == {"avx0", "avx1"}
    reasons = slm.scheduler.explain(spec).filters[0].reasons
    assert reasons == {
        "missing trait HW_CPU_X86_AVX2": 1,
        "has forbidden trait STORAGE_DISK_SSD": 2,
    }


def test_aggregates_any_of_all_of_and_forbidden(slm: Loadmaster) -> None:
    add_hosts(slm, 1, prefix="a", aggregates=["az1", "gold"])
    add_hosts(slm, 1, prefix="b", aggregates=["az2", "gold"])
    add_hosts(slm, 1, prefix="c", aggregates=["az2"])
    add_hosts(slm, 1, prefix="d")
    small_flavor(slm)
    many = {"flavor": "small", "count": 30}
    assert _hosts_of(slm, RequestSpec(**many, member_of=[["az1", "az2"]])) == {"a0", "b0", "c0"}
    assert _hosts_of(slm, RequestSpec(**many, member_of=[["az1", "az2"], ["gold"]])) == {"a0", "b0"}
    spec = RequestSpec(**many, member_of=[["az1", "az2"]], forbidden_aggregates=["gold"])
    assert _hosts_of(slm, spec) == {"c0"}


def test_include_and_exclude_hosts(slm: Loadmaster) -> None:
    add_hosts(slm, 4)
    small_flavor(slm)
    spec = RequestSpec(flavor="small", count=8, include_hosts=["h1", "h2"], exclude_hosts=["h2"])
    assert _hosts_of(slm, spec) == {"h1"}
    reasons = slm.scheduler.explain(spec).filters[0].reasons
    assert reasons == {
        "not a host asked for": 2,
        "excluded (where the VM runs, or by the request)": 1,
    }


def test_affinity_follows_the_placed_member(slm: Loadmaster) -> None:
    add_hosts(slm, 5)
    small_flavor(slm)
    slm.groups.create("db", "affinity")
    first, *rest = add_vms(slm, 3, group="db")
    slm.allocations.claim(first, "h3")  # still pending: it counts
    result = slm.scheduler.schedule([RequestSpec(vms=rest)])
    assert {p.host for p in result.placements} == {"h3"}


def test_anti_affinity_and_max_per_host(slm: Loadmaster) -> None:
    add_hosts(slm, 3)
    small_flavor(slm, vcpu=1, memory=512)
    slm.groups.create("web", "anti-affinity")
    slm.groups.create("web2", "anti-affinity", max_per_host=2)
    slm.groups.create("soft", "soft-affinity", max_per_host=3)
    for group, fits in (("web", 3), ("web2", 6), ("soft", 9)):
        result = slm.scheduler.schedule(
            [RequestSpec(vms=add_vms(slm, 12, group=group, prefix=group))]
        )
        assert len(result.placed) == fits, group
        message = str(result.failed[0].error)
        expected = (
            "max-per-host(group soft: 3)" if group == "soft" else f"anti-affinity(group {group})"
        )
        assert f"3 {expected}" in message
