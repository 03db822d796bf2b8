"""Pure rules: inventories, custom names, flavor parsing. No database."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadmaster.errors import ValidationError
from loadmaster.resources import Inventory, parse_flavor, validate_custom_name


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        ({"total": 0}, "inventory.total", "at least 1"),
        ({"total": -5}, "inventory.total", "at least 1"),
        ({"total": 10, "reserved": 11}, "inventory.reserved", "must not be greater than total"),
        ({"total": 10, "allocation_ratio": 0}, "inventory.allocation_ratio", "above 0"),
        ({"total": 10, "allocation_ratio": -1.5}, "inventory.allocation_ratio", "above 0"),
        ({"total": 10, "allocation_ratio": float("nan")}, "inventory.allocation_ratio", "finite"),
        (
            {"total": 10, "min_unit": 5, "max_unit": 4},
            "inventory.min_unit",
            "must not exceed max_unit",
        ),
        ({"total": 10, "step_size": 0}, "inventory.step_size", "at least 1"),
        ({"total": "10"}, "inventory.total", "integer"),
        ({"total": True}, "inventory.total", "integer"),
        ({"reserved": 1}, "inventory.total", "required"),
        ({"total": 1, "colour": "red"}, "inventory.colour", "not a field of Inventory"),
    ],
)
def test_bad_inventory_names_field_and_reason(
    data: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(ValidationError) as err:
        Inventory.parse(data)
    assert err.value.field == field
    assert reason in err.value.detail


@given(
    total=st.integers(1, 10**6),
    reserved_part=st.floats(0, 1),
    ratio=st.floats(0.1, 16),
)
def test_capacity_is_total_minus_reserved_times_ratio(
    total: int, reserved_part: float, ratio: float
) -> None:
    reserved = int(total * reserved_part)
    inv = Inventory.parse({"total": total, "reserved": reserved, "allocation_ratio": ratio})
    assert inv.capacity == int((total - reserved) * ratio)
    assert inv.capacity >= 0


def test_unit_rules() -> None:
    inv = Inventory(total=64, min_unit=2, max_unit=16, step_size=2)
    assert inv.unit_problem(4) is None
    assert "min_unit" in (inv.unit_problem(1) or "")
    assert "max_unit" in (inv.unit_problem(18) or "")
    assert "step_size" in (inv.unit_problem(5) or "")


@pytest.mark.parametrize(
    "name", ["GPU", "CUSTOM_", "CUSTOM_gpu", "CUSTOM-GPU", "custom_GPU", "", "CUSTOM_GPU!"]
)
def test_malformed_custom_class_names(name: str) -> None:
    with pytest.raises(ValidationError) as err:
        validate_custom_name(name)
    assert err.value.field == "name"


def test_nova_extra_specs_are_understood() -> None:
    spec = parse_flavor(
        {
            "name": "gpu.large",
            "resources": {"VCPU": 8, "MEMORY_MB": 16384},
            "extra_specs": {
                "resources:CUSTOM_GPU": "1",
                "resources:VCPU": "4",
                "trait:HW_CPU_X86_AVX2": "required",
                "trait:CUSTOM_SLOW_DISK": "forbidden",
                "hw:cpu_policy": "dedicated",
            },
        }
    )
    # Pinned CPUs are asked as PCPU, as Nova asks placement for them.
    assert spec.resources == {"PCPU": 4, "MEMORY_MB": 16384, "CUSTOM_GPU": 1}
    assert spec.required_traits == {"HW_CPU_X86_AVX2"}
    assert spec.forbidden_traits == {"CUSTOM_SLOW_DISK"}
    assert spec.extra_specs["hw:cpu_policy"] == "dedicated"
    assert spec.warnings == ()


def test_extra_specs_alone_give_a_flavor_its_resources() -> None:
    spec = parse_flavor(
        {
            "name": "ert",
            "extra_specs": {
                "resource:VCPU": "2",
                "resources:MEMORY_MB": "2048",
                "hw:cpu_policy": "shared",
                "hw:mem_page_size": "small",
            },
        }
    )
    assert spec.resources == {"VCPU": 2, "MEMORY_MB": 2048}


def test_unknown_extra_specs_are_kept_with_a_warning_naming_them_when_asked() -> None:
    definition = {
        "name": "f",
        "resources": {"VCPU": 1},
        "extra_specs": {"hw:foo": "1", "os:secure_boot": "required"},
    }
    with pytest.raises(ValidationError) as err:
        parse_flavor(definition)
    assert err.value.field == "extra_specs.hw:foo"
    spec = parse_flavor(definition, "warn")
    assert spec.warnings == (
        "extra_specs.hw:foo is not understood and is ignored",
        "extra_specs.os:secure_boot is not understood and is ignored",
    )
    assert spec.extra_specs == definition["extra_specs"]
    # Known specs loadmaster cannot honour are refused whatever the setting.
    with pytest.raises(ValidationError) as err:
        parse_flavor({**definition, "extra_specs": {"hw:numa_nodes": "2"}}, "warn")
    assert err.value.field == "extra_specs.hw:numa_nodes"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"resources:VCPU": "two"}, "extra_specs.resources:VCPU"),
        ({"resources:VCPU": "-1"}, "extra_specs.resources:VCPU"),
        ({"trait:HW_CPU_X86_AVX2": "preferred"}, "extra_specs.trait:HW_CPU_X86_AVX2"),
        ({"trait:lower_case": "required"}, "extra_specs.trait:lower_case"),
    ],
)
def test_bad_extra_specs(extra: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_flavor({"name": "f", "resources": {"VCPU": 1}, "extra_specs": extra})
    assert err.value.field == field


def test_flavor_needs_some_resource() -> None:
    with pytest.raises(ValidationError) as err:
        parse_flavor({"name": "empty", "resources": {"VCPU": 0}})
    assert err.value.field == "resources"
