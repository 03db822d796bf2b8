"""What a VM needs: resources and traits, from a flavor, its extra specs and overrides.

Nova users write ``resources:CUSTOM_FOO=1`` and ``trait:HW_CPU_X86_AVX2=required`` in
flavor extra specs; those are understood here so flavors move over unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from loadmaster.errors import ValidationError
from loadmaster.resources.inventory import parse_amounts
from loadmaster.resources.traits import validate_trait_name


@dataclass(frozen=True)
class Requirements:
    resources: Mapping[str, int]
    required_traits: frozenset[str] = frozenset()
    forbidden_traits: frozenset[str] = frozenset()

    def with_overrides(self, overrides: Mapping[str, int]) -> Requirements:
        """Overrides replace a class's amount; an amount of 0 drops the class."""
        merged = {**self.resources, **overrides}
        return Requirements(
            {name: amount for name, amount in merged.items() if amount > 0},
            self.required_traits,
            self.forbidden_traits,
        )


@dataclass(frozen=True)
class FlavorSpec:
    name: str
    resources: Mapping[str, int]
    required_traits: frozenset[str] = frozenset()
    forbidden_traits: frozenset[str] = frozenset()
    extra_specs: Mapping[str, str] = field(default_factory=dict)

    def requirements(self) -> Requirements:
        return Requirements(
            {name: amount for name, amount in self.resources.items() if amount > 0},
            self.required_traits,
            self.forbidden_traits,
        )


def _traits(value: object, field: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list | tuple | set | frozenset):
        raise ValidationError(f"{field} must be a list of trait names", field=field)
    return frozenset(validate_trait_name(t, f"{field}[{i}]") for i, t in enumerate(value))


def parse_flavor(data: Mapping[str, object]) -> FlavorSpec:
    """Validate a flavor definition and fold Nova-style extra specs into it."""
    known = {"name", "resources", "required_traits", "forbidden_traits", "extra_specs"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValidationError(f"{unknown[0]} is not a flavor field", field=unknown[0])
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise ValidationError(
            "name must be a non-empty string of at most 255 characters", field="name"
        )
    resources = parse_amounts(data.get("resources", {}), "resources")
    required = set(_traits(data.get("required_traits"), "required_traits"))
    forbidden = set(_traits(data.get("forbidden_traits"), "forbidden_traits"))
    extra_raw = data.get("extra_specs") or {}
    if not isinstance(extra_raw, Mapping):
        raise ValidationError(
            "extra_specs must be an object of string: string", field="extra_specs"
        )
    extra: dict[str, str] = {}
    for key, value in extra_raw.items():
        where = f"extra_specs.{key}"
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValidationError(f"{where} must map a string to a string", field=where)
        extra[key] = value
        if key.startswith("resources:"):
            rc = key.removeprefix("resources:")
            try:
                amount = int(value)
            except ValueError:
                raise ValidationError(
                    f"{where} must be an integer, got {value!r}", field=where
                ) from None
            if amount < 0:
                raise ValidationError(f"{where} must be at least 0, got {amount}", field=where)
            resources[rc] = amount
        elif key.startswith("trait:"):
            trait = validate_trait_name(key.removeprefix("trait:"), where)
            if value == "required":
                required.add(trait)
            elif value == "forbidden":
                forbidden.add(trait)
            else:
                raise ValidationError(
                    f"{where} must be 'required' or 'forbidden', got {value!r}", field=where
                )
    clash = required & forbidden
    if clash:
        trait = sorted(clash)[0]
        raise ValidationError(
            f"trait {trait} is both required and forbidden", field="required_traits"
        )
    if not any(amount > 0 for amount in resources.values()):
        raise ValidationError(
            "resources must request at least one class with an amount above 0", field="resources"
        )
    return FlavorSpec(name, resources, frozenset(required), frozenset(forbidden), extra)
