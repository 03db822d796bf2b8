"""A flavor's extra specs are applied where VMs are placed: member_of keeps its VMs in (or
out of) aggregates, resource:/resources: give their amounts, pinned CPUs ask PCPU."""

from __future__ import annotations

import pytest
from tests.scheduler.conftest import add_hosts

from loadmaster.cluster.catalog import UNKNOWN_SPECS_ENV, FlavorService
from loadmaster.errors import ValidationError
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster


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
    warned = FlavorService(slm.store).create(dict(definition))
    assert warned.warnings == ("extra_specs.hw:foo is not understood and is ignored",)
    with pytest.raises(ValidationError) as err:
        FlavorService(slm.store).create({**definition, "name": "g"}, unknown_specs="refuse")
    assert err.value.field == "extra_specs.hw:foo"
    assert [f.name for f in slm.flavors.list()] == ["f"]
    monkeypatch.setenv(UNKNOWN_SPECS_ENV, "ignore")
    with pytest.raises(ValidationError) as err:
        FlavorService(slm.store)
    assert err.value.field == "unknown_specs" and UNKNOWN_SPECS_ENV in err.value.detail
