"""A host's inventory of one resource class, and the rules an allocation must follow."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from loadmaster.errors import ValidationError

MAX_INT = 2**31 - 1


def _integer(value: object, field: str, *, minimum: int) -> int:
    # bool is an int in Python; "true" as an amount is a client bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{field} must be an integer, got {value!r}", field=field)
    if value < minimum:
        raise ValidationError(f"{field} must be at least {minimum}, got {value}", field=field)
    if value > MAX_INT:
        raise ValidationError(f"{field} must be at most {MAX_INT}, got {value}", field=field)
    return value


@dataclass(frozen=True)
class Inventory:
    total: int
    reserved: int = 0
    min_unit: int = 1
    max_unit: int = MAX_INT
    step_size: int = 1
    allocation_ratio: float = 1.0

    @property
    def capacity(self) -> int:
        # Placement truncates: a fractional unit can never be handed out.
        return int((self.total - self.reserved) * self.allocation_ratio)

    @classmethod
    def parse(cls, data: Mapping[str, object], field: str = "inventory") -> Inventory:
        """Build a validated inventory from user input; errors name ``field.<key>``."""
        known = {"total", "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValidationError(
                f"{field}.{unknown[0]} is not an inventory field (known: {', '.join(sorted(known))})",
                field=f"{field}.{unknown[0]}",
            )
        if "total" not in data:
            raise ValidationError(f"{field}.total is required", field=f"{field}.total")
        total = _integer(data["total"], f"{field}.total", minimum=1)
        reserved = _integer(data.get("reserved", 0), f"{field}.reserved", minimum=0)
        min_unit = _integer(data.get("min_unit", 1), f"{field}.min_unit", minimum=1)
        max_unit = _integer(data.get("max_unit", MAX_INT), f"{field}.max_unit", minimum=1)
        step_size = _integer(data.get("step_size", 1), f"{field}.step_size", minimum=1)
        ratio_raw = data.get("allocation_ratio", 1.0)
        if isinstance(ratio_raw, bool) or not isinstance(ratio_raw, int | float):
            raise ValidationError(
                f"{field}.allocation_ratio must be a number, got {ratio_raw!r}",
                field=f"{field}.allocation_ratio",
            )
        ratio = float(ratio_raw)
        if not math.isfinite(ratio) or ratio <= 0:
            raise ValidationError(
                f"{field}.allocation_ratio must be a finite number above 0, got {ratio_raw!r}",
                field=f"{field}.allocation_ratio",
            )
        if reserved > total:
            raise ValidationError(
                f"{field}.reserved ({reserved}) must not be greater than total ({total})",
                field=f"{field}.reserved",
            )
        if min_unit > max_unit:
            raise ValidationError(
                f"{field}.min_unit ({min_unit}) must not exceed max_unit ({max_unit})",
                field=f"{field}.min_unit",
            )
        return cls(total, reserved, min_unit, max_unit, step_size, ratio)

    def as_dict(self) -> dict[str, int | float]:
        return {
            "total": self.total,
            "reserved": self.reserved,
            "min_unit": self.min_unit,
            "max_unit": self.max_unit,
            "step_size": self.step_size,
            "allocation_ratio": self.allocation_ratio,
        }

    def unit_problem(self, amount: int) -> str | None:
        """Why a single allocation of ``amount`` breaks this inventory's unit rules, or None."""
        if amount < self.min_unit:
            return f"amount {amount} is below min_unit {self.min_unit}"
        if amount > self.max_unit:
            return f"amount {amount} is above max_unit {self.max_unit}"
        if amount % self.step_size:
            return f"amount {amount} is not a multiple of step_size {self.step_size}"
        return None

    def room_problem(self, amount: int, used: int) -> str | None:
        """Why ``amount`` more cannot be allocated where ``used`` is taken already (pending
        claims included), or None: the unit rules, then the capacity."""
        unit = self.unit_problem(amount)
        if unit is not None:
            return unit
        if used + amount > self.capacity:
            return f"needs {amount}, {self.capacity - used} free of capacity {self.capacity}"
        return None


def parse_amounts(data: object, field: str) -> dict[str, int]:
    """Validate a ``{class: amount}`` mapping (class names are checked against the store later)."""
    if not isinstance(data, Mapping):
        raise ValidationError(f"{field} must be an object of class: amount", field=field)
    amounts: dict[str, int] = {}
    for name, amount in data.items():
        if not isinstance(name, str) or not name:
            raise ValidationError(f"{field} has a class name that is not a string", field=field)
        amounts[name] = _integer(amount, f"{field}.{name}", minimum=0)
    return amounts
