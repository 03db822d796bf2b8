"""What to place: the request spec users send, and the resolved per-VM request plugins see."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import ConfigDict, Field, Strict, with_config

from loadmaster import shapes
from loadmaster.cluster.records import GroupRecord
from loadmaster.errors import ValidationError
from loadmaster.resources import parse_amounts, summed, validate_trait_name
from loadmaster.resources.tree_fit import Affinity
from loadmaster.shapes import Amount, Name

# Limits on one /schedule call. An operator places a rack or a region's worth of VMs at
# once, not a million: 10,000 VMs decide in seconds and answer in a few MB. Bigger
# questions ("how many fit?") have GET /capacity, which counts without placing one by one.
MAX_VMS_PER_CALL = 10_000


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class RequestSpec:
    """One entry of a ``schedule`` call, and of ``POST /schedule`` as it is.

    Either ``vms`` (uuids of existing VMs: resources, traits and server group come from
    each VM and its flavor) or ``flavor`` with ``count`` (hypothetical VMs, for dry runs and
    capacity questions). On top: ``required_traits`` / ``forbidden_traits``;
    ``member_of`` is a list of aggregate lists, each list any-of, all lists AND-ed
    (Placement's repeated ``member_of``); ``forbidden_aggregates``; ``include_hosts``
    (only these) and ``exclude_hosts`` by name or uuid.
    """

    # The scheduler checks the sum over a call's requests.
    vms: Annotated[Sequence[Name], Field(max_length=MAX_VMS_PER_CALL)] = ()
    flavor: Name | None = None
    count: Annotated[int, Strict(), Field(ge=1, le=MAX_VMS_PER_CALL)] | None = None
    overrides: Mapping[str, Amount] = field(default_factory=dict)
    required_traits: Sequence[Name] = ()
    forbidden_traits: Sequence[Name] = ()
    member_of: Sequence[Sequence[Name]] = ()
    forbidden_aggregates: Sequence[Name] = ()
    group: Name | None = None
    include_hosts: Sequence[Name] | None = None
    exclude_hosts: Sequence[Name] = ()

    def check(self, field: str = "") -> None:
        """The declared types and limits (for a spec built in Python), then the rules
        between fields; errors name ``field.<attribute>``."""
        shapes.check(self, field)
        dot = f"{field}." if field else ""
        if self.vms and self.flavor is not None:
            raise ValidationError(
                f"{dot}flavor: give either vms or flavor, not both (a VM brings its own flavor)",
                field=f"{dot}flavor",
            )
        if not self.vms and self.flavor is None:
            raise ValidationError(
                f"{dot}vms: a request needs vms to place or a flavor", field=f"{dot}vms"
            )
        if self.vms and self.count is not None and self.count != len(self.vms):
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
            for i, trait in enumerate(getattr(self, attr)):
                validate_trait_name(trait, f"{dot}{attr}[{i}]")
        clash = set(self.required_traits) & set(self.forbidden_traits)
        if clash:
            raise ValidationError(
                f"{dot}required_traits: {sorted(clash)[0]} is both required and forbidden",
                field=f"{dot}required_traits",
            )
        for i, any_of in enumerate(self.member_of):
            if not any_of:
                raise ValidationError(
                    f"{dot}member_of[{i}] must name at least one aggregate",
                    field=f"{dot}member_of[{i}]",
                )
        if self.include_hosts is not None and not self.include_hosts:
            raise ValidationError(
                f"{dot}include_hosts is empty: no host could be chosen",
                field=f"{dot}include_hosts",
            )


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
    # hw:pci_numa_affinity_policy: how its devices sit against that node (tree_fit).
    pci_numa_affinity: Affinity | None = None
    # Per class, the traits the provider it is taken from must have (a PCI alias's).
    class_traits: tuple[tuple[str, frozenset[str]], ...] = ()
    # A running VM's classes held on sharing providers, as (class, provider row): a host
    # reaching that provider takes the VM without them (its disk stays on the pool).
    shared_held: tuple[tuple[str, int], ...] = ()

    @property
    def companion_total(self) -> dict[str, int]:
        return summed(self.companions)
