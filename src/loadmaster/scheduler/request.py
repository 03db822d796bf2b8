"""What to place: the request spec users send, and the resolved per-VM request plugins see."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from loadmaster.cluster.groups import GroupRecord
from loadmaster.errors import ValidationError
from loadmaster.resources import parse_amounts, validate_trait_name


@dataclass(frozen=True)
class RequestSpec:
    """One entry of a ``schedule`` call.

    Either ``vms`` (uuids of existing VMs: resources, traits and server group come from
    each VM and its flavor) or ``flavor`` with ``count`` (hypothetical VMs, for dry runs and
    capacity questions). On top: ``required_traits`` / ``forbidden_traits``;
    ``member_of`` is a list of aggregate lists, each list any-of, all lists AND-ed
    (Placement's repeated ``member_of``); ``forbidden_aggregates``; ``include_hosts``
    (only these) and ``exclude_hosts`` by name or uuid.
    """

    vms: Sequence[str] = ()
    flavor: str | None = None
    count: int | None = None
    overrides: Mapping[str, int] = field(default_factory=dict)
    required_traits: Sequence[str] = ()
    forbidden_traits: Sequence[str] = ()
    member_of: Sequence[Sequence[str]] = ()
    forbidden_aggregates: Sequence[str] = ()
    group: str | None = None
    include_hosts: Sequence[str] | None = None
    exclude_hosts: Sequence[str] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "") -> RequestSpec:
        """Build from JSON; an unknown key is an error naming it."""
        known = {f.name for f in fields(cls)}
        dot = f"{field}." if field else ""
        if not isinstance(data, Mapping):
            raise ValidationError(f"{field or 'request'} must be an object", field=field or None)
        for key in data:
            if key not in known:
                raise ValidationError(
                    f"{dot}{key} is not a request field (known: {', '.join(sorted(known))})",
                    field=f"{dot}{key}",
                )
        return cls(**data)

    def check(self, field: str = "") -> None:
        """Shape checks that need no database; errors name ``field.<attribute>``."""
        dot = f"{field}." if field else ""
        _names(self.vms, f"{dot}vms")
        if self.vms and self.flavor is not None:
            raise ValidationError(
                f"{dot}flavor: give either vms or flavor, not both (a VM brings its own flavor)",
                field=f"{dot}flavor",
            )
        if not self.vms and self.flavor is None:
            raise ValidationError(
                f"{dot}vms: a request needs vms to place or a flavor", field=f"{dot}vms"
            )
        if self.flavor is not None and (not isinstance(self.flavor, str) or not self.flavor):
            raise ValidationError(f"{dot}flavor must be a flavor name", field=f"{dot}flavor")
        if self.count is not None:
            if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
                raise ValidationError(
                    f"{dot}count must be an integer of at least 1, got {self.count!r}",
                    field=f"{dot}count",
                )
            if self.vms and self.count != len(self.vms):
                raise ValidationError(
                    f"{dot}count ({self.count}) differs from the number of vms ({len(self.vms)})",
                    field=f"{dot}count",
                )
        if self.overrides and self.vms:
            raise ValidationError(
                f"{dot}overrides apply to flavor requests; a VM's resources come from its "
                "flavor and its own overrides",
                field=f"{dot}overrides",
            )
        parse_amounts(self.overrides, f"{dot}overrides")
        for attr in ("required_traits", "forbidden_traits"):
            for i, trait in enumerate(_names(getattr(self, attr), f"{dot}{attr}")):
                validate_trait_name(trait, f"{dot}{attr}[{i}]")
        clash = set(self.required_traits) & set(self.forbidden_traits)
        if clash:
            raise ValidationError(
                f"{dot}required_traits: {sorted(clash)[0]} is both required and forbidden",
                field=f"{dot}required_traits",
            )
        if isinstance(self.member_of, str):
            raise ValidationError(
                f"{dot}member_of must be a list of aggregate lists", field=f"{dot}member_of"
            )
        for i, any_of in enumerate(self.member_of):
            if not _names(any_of, f"{dot}member_of[{i}]"):
                raise ValidationError(
                    f"{dot}member_of[{i}] must name at least one aggregate",
                    field=f"{dot}member_of[{i}]",
                )
        _names(self.forbidden_aggregates, f"{dot}forbidden_aggregates")
        if self.group is not None and (not isinstance(self.group, str) or not self.group):
            raise ValidationError(f"{dot}group must be a server group name", field=f"{dot}group")
        if self.include_hosts is not None and not _names(self.include_hosts, f"{dot}include_hosts"):
            raise ValidationError(
                f"{dot}include_hosts is empty: no host could be chosen",
                field=f"{dot}include_hosts",
            )
        _names(self.exclude_hosts, f"{dot}exclude_hosts")

    def to_dict(self) -> dict[str, object]:
        return {
            "vms": list(self.vms),
            "flavor": self.flavor,
            "count": self.count,
            "overrides": dict(self.overrides),
            "required_traits": list(self.required_traits),
            "forbidden_traits": list(self.forbidden_traits),
            "member_of": [list(m) for m in self.member_of],
            "forbidden_aggregates": list(self.forbidden_aggregates),
            "group": self.group,
            "include_hosts": None if self.include_hosts is None else list(self.include_hosts),
            "exclude_hosts": list(self.exclude_hosts),
        }


def summed(amounts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Per class, the sum of several VMs' amounts."""
    total: dict[str, int] = {}
    for member in amounts:
        for name, amount in member.items():
            total[name] = total.get(name, 0) + amount
    return total


def _names(value: object, field: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence | set | frozenset):
        raise ValidationError(f"{field} must be a list of strings", field=field)
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ValidationError(
                f"{field}[{i}] must be a non-empty string, got {item!r}", field=f"{field}[{i}]"
            )
        out.append(item)
    return out


@dataclass
class VmRequest:
    """One VM to place, resolved: what filters and weighers look at.

    ``vm`` is None for a hypothetical VM (dry run, capacity). ``companions`` holds the
    resources of each other member of a hard-affinity group in the same batch: the first
    member's host must have room for all of them (``companion_total``), so the group is
    never split. ``group_size`` counts the group's members placed before the call plus
    those in it, for explaining a group rule that leaves no host.
    """

    vm: str | None
    label: str
    flavor: str
    resources: dict[str, int]
    required_traits: frozenset[str] = frozenset()
    forbidden_traits: frozenset[str] = frozenset()
    member_of: tuple[frozenset[str], ...] = ()
    forbidden_aggregates: frozenset[str] = frozenset()
    group: GroupRecord | None = None
    include_hosts: frozenset[str] | None = None
    exclude_hosts: frozenset[str] = frozenset()
    companions: tuple[Mapping[str, int], ...] = ()
    group_size: int = 1
    # hw:numa_nodes=1: what the host's NUMA nodes offer comes all from one node.
    one_numa_node: bool = False

    @property
    def companion_total(self) -> dict[str, int]:
        return summed(self.companions)
