"""Bad request specs and server groups: clear errors naming the field, nothing written."""

from __future__ import annotations

import pytest
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster import shapes
from loadmaster.errors import (
    Conflict,
    InvalidTransition,
    LoadmasterError,
    NotFound,
    ValidationError,
)
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster


@pytest.mark.parametrize(
    ("spec", "error", "field"),
    [
        (RequestSpec(flavor="small", count=0), ValidationError, "requests[0].count"),
        (RequestSpec(flavor="nope"), NotFound, "requests[0].flavor"),
        (
            RequestSpec(flavor="small", required_traits=["CUSTOM_NOPE"]),
            NotFound,
            "requests[0].required_traits",
        ),
        (
            RequestSpec(flavor="small", required_traits=["lower"]),
            ValidationError,
            "requests[0].required_traits[0]",
        ),
        (RequestSpec(flavor="small", group="ghost"), NotFound, "requests[0].group"),
        (
            RequestSpec(flavor="small", include_hosts=["h0", "nowhere"]),
            NotFound,
            "requests[0].include_hosts[1]",
        ),
        (
            RequestSpec(flavor="small", include_hosts=[]),
            ValidationError,
            "requests[0].include_hosts",
        ),
        (RequestSpec(flavor="small", member_of=[[]]), ValidationError, "requests[0].member_of[0]"),
        (RequestSpec(), ValidationError, "requests[0].vms"),
        (RequestSpec(vms=["x"], flavor="small"), ValidationError, "requests[0].flavor"),
        (RequestSpec(vms=["7b0c4a8e-0000-4000-8000-000000000000"]), NotFound, "requests[0].vms[0]"),
        (
            RequestSpec(
                flavor="small",
                required_traits=["HW_CPU_X86_AVX2"],
                forbidden_traits=["HW_CPU_X86_AVX2"],
            ),
            ValidationError,
            "requests[0].required_traits",
        ),
    ],
)
def test_bad_specs_name_the_field(
    slm: Loadmaster, spec: RequestSpec, error: type[LoadmasterError], field: str
) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    with pytest.raises(error) as caught:
        slm.scheduler.schedule([spec], dry_run=True)
    assert caught.value.field == field
    assert slm.allocations.allocations() == []


def test_other_bad_calls(slm: Loadmaster) -> None:
    add_hosts(slm, 1)
    small_flavor(slm)
    with pytest.raises(ValidationError, match="policy 'spreed'") as caught:
        slm.scheduler.schedule([RequestSpec(flavor="small")], dry_run=True, policy="spreed")
    assert caught.value.field == "policy"
    with pytest.raises(ValidationError, match="create the VMs first"):
        slm.scheduler.schedule([RequestSpec(flavor="small")])
    with pytest.raises(ValidationError, match=r"requests\[0\]\.colour is not a field") as caught:
        shapes.parse(RequestSpec, {"flavor": "small", "colour": "red"}, "requests[0]")
    assert caught.value.field == "requests[0].colour"
    vm = add_vms(slm, 1)[0]
    with pytest.raises(ValidationError, match="twice"):
        slm.scheduler.schedule([RequestSpec(vms=[vm]), RequestSpec(vms=[vm])])
    assert shapes.parse(RequestSpec, shapes.dump(RequestSpec(vms=[vm]))) == RequestSpec(
        vms=[vm],
        overrides={},
        required_traits=[],
        forbidden_traits=[],
        member_of=[],
        forbidden_aggregates=[],
        exclude_hosts=[],
    )


def test_a_vm_already_placed_is_told_why(slm: Loadmaster) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    placed, fresh = add_vms(slm, 2)
    slm.allocations.claim(placed, "h0")
    result = slm.scheduler.schedule([RequestSpec(vms=[placed, fresh])])
    assert isinstance(result.placements[0].error, InvalidTransition)
    assert result.placements[1].ok


def test_running_vm_is_migrated_elsewhere(slm: Loadmaster) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    vm = add_vms(slm, 1)[0]
    slm.allocations.claim(vm, "h0")
    slm.allocations.activate(vm)
    result = slm.scheduler.schedule([RequestSpec(vms=[vm])])
    assert result.placements[0].host == "h1"
    assert slm.vms.get(vm).state == "migrating"


def test_server_groups(slm: Loadmaster) -> None:
    group = slm.groups.create("web", "anti-affinity", max_per_host=2)
    assert group.max_per_host == 2 and group.hard
    assert slm.groups.get(group.uuid) == group == slm.groups.get("web")
    with pytest.raises(ValidationError) as caught:
        slm.groups.create("x", "anti-afinity")
    assert caught.value.field == "policy" and "anti-affinity" in caught.value.detail
    with pytest.raises(ValidationError, match="does not apply to affinity"):
        slm.groups.create("y", "affinity", max_per_host=2)
    with pytest.raises(ValidationError, match="at least 1"):
        slm.groups.create("z", "soft-anti-affinity", max_per_host=0)
    with pytest.raises(Conflict):
        slm.groups.create("web", "affinity")
    small_flavor(slm)
    vm = add_vms(slm, 1, group="web")[0]
    assert [v.uuid for v in slm.groups.members("web")] == [vm]
    with pytest.raises(Conflict, match="1 member"):
        slm.groups.delete("web")
    slm.allocations.delete(vm)
    slm.groups.delete("web")
    assert slm.groups.list() == []
    with pytest.raises(NotFound):
        slm.groups.get("web")


def test_request_group_must_match_the_vms_own(slm: Loadmaster) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    slm.groups.create("a", "anti-affinity")
    slm.groups.create("b", "anti-affinity")
    vm = add_vms(slm, 1, group="a")[0]
    with pytest.raises(ValidationError) as caught:
        slm.scheduler.schedule([RequestSpec(vms=[vm], group="b")])
    assert caught.value.field == "requests[0].group"
