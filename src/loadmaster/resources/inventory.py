"""A host's inventory of one resource class, and the rules an allocation must follow."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import AllowInfNan, ConfigDict, Field, Strict, with_config

from loadmaster import shapes
from loadmaster.errors import ValidationError
from loadmaster.shapes import MAX_INT, Amount, Name, PositiveAmount

# A ratio of a million is already absurd; Placement accepts up to 3.4e38, which only
# overflows the capacity.
MAX_RATIO = 1e6


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class Inventory:
    """A host's inventory of one class: a body of Placement's inventory routes as it is, an
    answer of them, and what the ledger checks allocations against."""

    total: PositiveAmount
    reserved: Amount = 0
    min_unit: PositiveAmount = 1
    max_unit: PositiveAmount = MAX_INT
    step_size: PositiveAmount = 1
    allocation_ratio: Annotated[float, Strict(), AllowInfNan(False), Field(gt=0, le=MAX_RATIO)] = (
        1.0
    )

    @property
    def capacity(self) -> int:
        # Placement truncates: a fractional unit can never be handed out.
        return int((self.total - self.reserved) * self.allocation_ratio)

    @classmethod
    def parse(cls, data: Mapping[str, object] | Inventory, field: str = "inventory") -> Inventory:
        """A checked inventory from user input (or one built in Python); errors name
        ``field.<key>``."""
        if isinstance(data, Inventory):  # or a body that carries one among other fields
            data = {f.name: getattr(data, f.name) for f in dataclasses.fields(Inventory)}
        inventory = shapes.parse(cls, data, field)
        if inventory.reserved > inventory.total:
            raise ValidationError(
                f"{field}.reserved ({inventory.reserved}) must not be greater than total "
                f"({inventory.total})",
                field=f"{field}.reserved",
            )
        if inventory.min_unit > inventory.max_unit:
            raise ValidationError(
                f"{field}.min_unit ({inventory.min_unit}) must not exceed max_unit "
                f"({inventory.max_unit})",
                field=f"{field}.min_unit",
            )
        return inventory

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
    return shapes.parse(dict[Name, Amount], data, field)


def summed(amounts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Per class, the sum of several VMs' amounts."""
    total: dict[str, int] = {}
    for member in amounts:
        for name, amount in member.items():
            total[name] = total.get(name, 0) + amount
    return total
