"""What a VM needs: resources and traits, from a flavor, its extra specs and overrides.

Nova users write ``resources:CUSTOM_FOO=1`` and ``trait:HW_CPU_X86_AVX2=required`` in
flavor extra specs; those are understood here so flavors move over unchanged. Every extra
spec is either applied, refused with the reason loadmaster cannot honour it, or (a key
loadmaster does not know) refused or kept with a warning, as ``unknown_specs`` says: a
spec stored but silently ignored would place VMs where the flavor says they must not go.

Understood: ``resources:CLASS=N`` and ``resource:CLASS=N`` (the "Extensible Resource
Tracking" spelling); ``trait:NAME=required|forbidden``; ``member_of`` (``in:a,b`` or
``a,b``: any of these aggregates; a leading ``!`` forbids them); ``hw:cpu_policy``
(``shared``, or ``dedicated``: the VCPU amount is asked as PCPU, pinned CPUs);
``hw:mem_page_size`` ``small`` or ``any`` (the default pages); ``hw:numa_nodes=1`` (what
a host's NUMA nodes, its child providers, offer comes all from one node); ``lm:image`` and
``lm:network``, the image and network of the flavor's VMs that name none;
``lm:vnic_type=direct``: the VM's NIC is one of its VFs (asked by ``pci_passthrough:alias``),
``<interface type='hostdev'>``, as Nova's port ``vnic_type=direct``; Nova's libvirt
``quota:`` specs (``loadmaster.quota``; an unknown one is refused, whatever
``unknown_specs`` says, as a limit silently not applied would be). Refused, with
the reason: ``aggregate_instance_extra_specs:*`` (loadmaster aggregates carry no metadata
to match), other page sizes (huge pages are not tracked), more NUMA nodes than one.
``hw:pci_numa_affinity_policy`` ``required``, ``legacy`` or ``preferred`` (the VM on one
NUMA node, its devices judged against it: ``tree_fit``; ``socket`` is refused).
``pci_passthrough:alias=NAME:N,...`` asks N host devices of each alias the server defines
(``aliases.py``): their class, and their traits required.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from loadmaster.errors import ValidationError
from loadmaster.images import IMAGE_SPEC, NETWORK_SPEC, check_image_name, check_name
from loadmaster.quota import check_quota_spec, flavor_quota, is_quota_spec
from loadmaster.resources.aliases import ALIAS_SPEC, PciAlias, alias_requests
from loadmaster.resources.inventory import parse_amounts
from loadmaster.resources.traits import validate_trait_name
from loadmaster.resources.tree_fit import AFFINITIES, Affinity

UnknownSpecs = Literal["refuse", "warn"]
UNKNOWN_SPECS: tuple[UnknownSpecs, ...] = ("refuse", "warn")


@dataclass(frozen=True)
class FlavorSpec:
    name: str
    resources: Mapping[str, int]
    required_traits: frozenset[str] = frozenset()
    forbidden_traits: frozenset[str] = frozenset()
    extra_specs: Mapping[str, str] = field(default_factory=dict)
    # Extra specs kept but not applied (``unknown_specs="warn"``), each naming its key.
    warnings: tuple[str, ...] = ()
    # Per class, the traits the provider it is taken from must have (a PCI alias's).
    class_traits: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _traits(value: object, field: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list | tuple | set | frozenset):
        raise ValidationError(f"{field} must be a list of trait names", field=field)
    return frozenset(validate_trait_name(t, f"{field}[{i}]") for i, t in enumerate(value))


def aggregate_specs(
    extra_specs: Mapping[str, str],
) -> tuple[tuple[frozenset[str], ...], frozenset[str]]:
    """``member_of`` of a flavor's extra specs: (any-of lists, forbidden aggregates)."""
    value = extra_specs.get("member_of")
    if value is None:
        return (), frozenset()
    forbid = value.startswith("!")
    names = frozenset(
        n.strip() for n in value.removeprefix("!").removeprefix("in:").split(",") if n.strip()
    )
    if not names:
        raise ValidationError(
            f"extra_specs.member_of must name aggregates (in:a,b or !a), got {value!r}",
            field="extra_specs.member_of",
        )
    return ((), names) if forbid else ((names,), frozenset())


# Known keys loadmaster cannot honour, and why (a key's value may be honoured, see below).
_REFUSED_PREFIXES = {
    "aggregate_instance_extra_specs:": (
        "loadmaster aggregates carry no metadata to match; put the hosts in an aggregate "
        "and use member_of"
    ),
}
# The VM's NIC is one of its VFs (``direct``: Nova's port ``vnic_type=direct``), or a
# virtio NIC on the host's network (``normal``, the default).
VNIC_SPEC = "lm:vnic_type"
AFFINITY_SPEC = "hw:pci_numa_affinity_policy"
_ACCEPTED_VALUES = {
    VNIC_SPEC: ("normal", "direct"),
    "hw:cpu_policy": ("shared", "dedicated"),
    "hw:mem_page_size": ("small", "any"),
    "hw:numa_nodes": ("1",),
    "hw:pci_numa_affinity_policy": AFFINITIES,
}
_VALUE_REASONS = {
    VNIC_SPEC: "a NIC is a VF of the VM's (direct) or virtio on the host's network (normal)",
    "hw:cpu_policy": "mixed policies are not modelled (shared or dedicated)",
    "hw:mem_page_size": "huge pages are not tracked (small or any)",
    "hw:numa_nodes": "a VM spread over several NUMA nodes is not modelled (1 only)",
    "hw:pci_numa_affinity_policy": ("sockets are not modelled (required, legacy or preferred)"),
}


def one_numa_node(extra_specs: Mapping[str, str]) -> bool:
    """``hw:numa_nodes=1``: the classes a host's NUMA nodes (its child providers) offer
    come all from one of them."""
    return extra_specs.get("hw:numa_nodes") == "1"


def pci_numa_affinity(extra_specs: Mapping[str, str]) -> Affinity | None:
    """``hw:pci_numa_affinity_policy``: how the VM's devices must sit against its NUMA node
    (``tree_fit``); the VM's CPUs and memory then come from one node, as with
    ``hw:numa_nodes=1``."""
    value = extra_specs.get(AFFINITY_SPEC)
    if value is None:  # most flavors: asked once per VM placed
        return None
    return next((a for a in AFFINITIES if a == value), None)


# A numbered (granular) request group's keys, as Nova's: resources1:CLASS, trait1:NAME,
# or with a name, resources_GPU:CLASS.
_GROUP_KEY = re.compile(r"^(resources|trait)(\d+|_[A-Za-z0-9_-]{1,64}):(.*)$")


def extra_spec_names(extra_specs: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``(key, "class" or "trait", name)`` for each class or trait an extra spec names,
    so that a name the store does not know is refused naming the extra spec."""
    out = []
    for key in extra_specs:
        prefix, colon, rest = key.partition(":")
        if (grouped := _GROUP_KEY.match(key)) is not None:
            kind = "class" if grouped[1] == "resources" else "trait"
            out.append((key, kind, grouped[3]))
        elif colon and prefix in ("resources", "resource"):
            out.append((key, "class", rest))
        elif colon and prefix == "trait":
            out.append((key, "trait", rest))
    return out


def _groups(extra: Mapping[str, str]) -> tuple[dict[str, int], dict[str, frozenset[str]]]:
    """Numbered request groups (``resources1:CLASS=N`` with ``trait1:NAME=required``): the
    amounts they ask, and per class the traits its provider must have, as Placement
    binds a group's traits to its resources. One class in one group only; a forbidden
    trait in a group and ``group_policy=isolate`` are refused, not modelled."""
    amounts: dict[str, tuple[str, int]] = {}
    traits: dict[str, set[str]] = {}
    for key, value in extra.items():
        grouped = _GROUP_KEY.match(key)
        if grouped is None:
            continue
        where = f"extra_specs.{key}"
        if grouped[1] == "trait":
            trait = validate_trait_name(grouped[3], where)
            if value != "required":
                raise ValidationError(
                    f"{where}={value!r} is refused: a request group's traits are required "
                    "ones (forbidden traits apply to the whole flavor: trait:NAME=forbidden)",
                    field=where,
                )
            traits.setdefault(grouped[2], set()).add(trait)
            continue
        name = grouped[3]
        earlier = amounts.get(name)
        if earlier is not None or f"resources:{name}" in extra or f"resource:{name}" in extra:
            raise ValidationError(
                f"{where}: {name} is asked by another group too; a class comes from one group",
                field=where,
            )
        amounts[name] = (grouped[2], _amount(value, where))
    for group in sorted(traits):
        if group not in {g for g, _ in amounts.values()}:
            raise ValidationError(
                f"extra_specs.trait{group}: request group {group} asks no resources",
                field=f"extra_specs.trait{group}",
            )
    return (
        {name: amount for name, (_, amount) in amounts.items()},
        {
            name: frozenset(traits[group])
            for name, (group, _) in amounts.items()
            if traits.get(group)
        },
    )


def _amount(value: str, where: str) -> int:
    try:
        amount = int(value)
    except ValueError:
        raise ValidationError(f"{where} must be an integer, got {value!r}", field=where) from None
    if amount < 0:
        raise ValidationError(f"{where} must be at least 0, got {amount}", field=where)
    return amount


def parse_flavor(
    data: Mapping[str, object],
    unknown_specs: UnknownSpecs = "refuse",
    aliases: Mapping[str, PciAlias] | None = None,
) -> FlavorSpec:
    """Validate a flavor definition and fold Nova-style extra specs into it (see the
    module docstring); ``unknown_specs`` says what an extra spec loadmaster does not
    know does: ``refuse`` the flavor, or ``warn`` (kept, not applied, named in
    ``warnings``); ``aliases``: the server's PCI aliases."""
    if unknown_specs not in UNKNOWN_SPECS:
        raise ValidationError(
            f"unknown_specs must be refuse or warn, got {unknown_specs!r}", field="unknown_specs"
        )
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
    warnings: list[str] = []
    class_traits: dict[str, frozenset[str]] = {}
    # The NUMA policies of the aliases asked, by alias.
    policies: dict[str, Affinity] = {}
    for key, value in extra_raw.items():
        where = f"extra_specs.{key}"
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValidationError(f"{where} must map a string to a string", field=where)
        extra[key] = value
        prefix, colon, rest = key.partition(":")
        if _GROUP_KEY.match(key):
            continue  # request groups are read together below
        if key == "group_policy":
            if value != "none":
                raise ValidationError(
                    f"{where}={value!r} is refused: groups on separate providers are not "
                    "modelled (none)",
                    field=where,
                )
        elif colon and prefix in ("resources", "resource"):
            resources[rest] = _amount(value, where)
        elif colon and prefix == "trait":
            trait = validate_trait_name(rest, where)
            if value == "required":
                required.add(trait)
            elif value == "forbidden":
                forbidden.add(trait)
            else:
                raise ValidationError(
                    f"{where} must be 'required' or 'forbidden', got {value!r}", field=where
                )
        elif key == "member_of":
            aggregate_specs(extra)
        elif key == ALIAS_SPEC:
            for alias, count in alias_requests(value, aliases or {}, where):
                resources[alias.resource_class] = resources.get(alias.resource_class, 0) + count
                required |= alias.traits
                if alias.numa_policy is not None:
                    policies[alias.name] = alias.numa_policy
                if alias.traits:
                    class_traits[alias.resource_class] = (
                        class_traits.get(alias.resource_class, frozenset()) | alias.traits
                    )
        elif key == IMAGE_SPEC:
            check_image_name(value, where)
        elif key == NETWORK_SPEC:
            check_name(value, "a network", where)
        elif is_quota_spec(key):
            check_quota_spec(key, value)
        elif key in _ACCEPTED_VALUES:
            if value not in _ACCEPTED_VALUES[key]:
                raise ValidationError(
                    f"{where}={value!r} is refused: {_VALUE_REASONS[key]}", field=where
                )
        elif refused := next((r for p, r in _REFUSED_PREFIXES.items() if key.startswith(p)), None):
            raise ValidationError(f"{where} is refused: {refused}", field=where)
        elif unknown_specs == "refuse":
            raise ValidationError(
                f"{where} is not an extra spec loadmaster understands, so it would be "
                "ignored; remove it, or keep it unused: create the flavor with "
                '`--unknown-specs warn` (API: "unknown_specs": "warn")',
                field=where,
            )
        else:
            warnings.append(f"{where} is not understood and is ignored")
    flavor_quota(extra)
    if extra.get(VNIC_SPEC) == "direct" and ALIAS_SPEC not in extra:
        raise ValidationError(
            f"extra_specs.{VNIC_SPEC}=direct makes the VM's NIC one of its VFs: ask the VF "
            f"with {ALIAS_SPEC} (an alias of device_type type-VF)",
            field=f"extra_specs.{VNIC_SPEC}",
        )
    if policies and AFFINITY_SPEC not in extra:
        if len(set(policies.values())) > 1:
            named = ", ".join(f"{a} {p}" for a, p in sorted(policies.items()))
            raise ValidationError(
                f"extra_specs.{ALIAS_SPEC}: its aliases ask different NUMA policies ({named}); "
                f"a VM has one: set {AFFINITY_SPEC}",
                field=f"extra_specs.{ALIAS_SPEC}",
            )
        # Folded in as the alias's class and traits are: the flavor's own spec wins.
        extra[AFFINITY_SPEC] = next(iter(policies.values()))
    grouped, bound = _groups(extra)
    for class_name, amount in grouped.items():
        resources[class_name] = resources.get(class_name, 0) + amount
    for class_name, traits in bound.items():
        class_traits[class_name] = class_traits.get(class_name, frozenset()) | traits
    if extra.get("hw:cpu_policy") == "dedicated" and "VCPU" in resources:
        # Nova asks placement for pinned CPUs as PCPU instead of VCPU.
        resources["PCPU"] = resources.get("PCPU", 0) + resources.pop("VCPU")
    clash = required & forbidden
    if clash:
        trait = sorted(clash)[0]
        raise ValidationError(
            f"trait {trait} is both required and forbidden", field="required_traits"
        )
    if not any(amount > 0 for amount in resources.values()):
        raise ValidationError(
            "resources must request at least one class with an amount above 0 (in resources "
            "or as resources:CLASS extra specs)",
            field="resources",
        )
    return FlavorSpec(
        name,
        resources,
        frozenset(required),
        frozenset(forbidden),
        extra,
        tuple(warnings),
        class_traits,
    )
