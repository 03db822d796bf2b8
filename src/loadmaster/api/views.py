"""Records as the typed answers of ``responses.py``, in Placement's shapes where the
concept is Placement's: each answer's keys are declared once, by its model."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from loadmaster.api.responses import (
    ClassUsageOut,
    FlavorOut,
    GroupDetail,
    GroupOut,
    HostDetail,
    HostOut,
    ImageOut,
    InventoriesOut,
    LinkOut,
    OneInventoryOut,
    PlacementClassOut,
    ProviderOut,
    ResourceClassOut,
    VmDetail,
    VmOut,
)
from loadmaster.cluster import (
    AllocationRecord,
    ClassUsage,
    FlavorRecord,
    GroupRecord,
    HostRecord,
    VmRecord,
)
from loadmaster.cluster.images import ImageRecord
from loadmaster.microversions import Version
from loadmaster.pending import ReconcileResult
from loadmaster.resources import ResourceClass, in_class_order


def resource_class(rc: ResourceClass) -> ResourceClassOut:
    return ResourceClassOut.model_validate(rc, from_attributes=True)


def placement_class(name: str) -> PlacementClassOut:
    """Placement's representation of a resource class."""
    return PlacementClassOut(
        name=name, links=[LinkOut(rel="self", href=f"/resource_classes/{name}")]
    )


def host(host: HostRecord) -> HostOut:
    """loadmaster's view of a host (``/hosts``)."""
    return HostOut(
        uuid=host.uuid,
        name=host.name,
        generation=host.generation,
        state=host.state,
        parent_provider_uuid=host.parent,
        root_provider_uuid=host.root,
        traits=list(host.traits),
        aggregates=list(host.aggregates),
    )


def host_detail(record: HostRecord, status: str, drain: Mapping[str, Any] | None) -> HostDetail:
    """A host with its drain's progress (``GET /hosts/{host}``)."""
    return HostDetail.model_validate({**dict(host(record)), "status": status, "drain": drain})


# Placement's links of a provider, each from the microversion that brought its path.
_PROVIDER_LINKS = (
    ("inventories", (1, 0)),
    ("usages", (1, 0)),
    ("aggregates", (1, 1)),
    ("traits", (1, 6)),
    ("allocations", (1, 11)),
)
PARENT_SINCE = (1, 14)


def provider(host: HostRecord, version: Version) -> ProviderOut:
    """Placement's representation of a resource provider at ``version``: exactly these
    keys (the route leaves out what is not set), since Placement's clients and tests
    check them all."""
    base = f"/resource_providers/{host.uuid}"
    links = [LinkOut(rel="self", href=base)]
    links += [
        LinkOut(rel=rel, href=f"{base}/{rel}")
        for rel, since in _PROVIDER_LINKS
        if version.matches(*since)
    ]
    out = ProviderOut(uuid=host.uuid, name=host.name, generation=host.generation, links=links)
    if version.matches(*PARENT_SINCE):
        out.parent_provider_uuid = host.parent
        out.root_provider_uuid = host.root
    return out


def inventories(host: HostRecord) -> InventoriesOut:
    """Placement's inventory set (capacity is in loadmaster's usage views)."""
    return InventoriesOut(
        resource_provider_generation=host.generation,
        inventories=in_class_order(host.inventories),
    )


def inventory_of(host: HostRecord, resource_class: str) -> OneInventoryOut:
    """Placement's one inventory: its fields and the provider's generation."""
    return OneInventoryOut(
        **dataclasses.asdict(host.inventories[resource_class]),
        resource_provider_generation=host.generation,
    )


def usage(usages: Mapping[str, ClassUsage]) -> dict[str, ClassUsageOut]:
    return {
        name: ClassUsageOut.model_validate(u, from_attributes=True)
        for name, u in in_class_order(usages).items()
    }


def flavor(f: FlavorRecord) -> FlavorOut:
    return FlavorOut.model_validate(f, from_attributes=True)


def image(i: ImageRecord) -> ImageOut:
    return ImageOut.model_validate(i, from_attributes=True)


def vm(v: VmRecord) -> VmOut:
    return VmOut.model_validate(v, from_attributes=True)


def vm_detail(v: VmRecord, host_agent: str | None) -> VmDetail:
    return VmDetail.model_validate({**dict(vm(v)), "host_agent": host_agent})


def group(g: GroupRecord, members: Iterable[VmRecord] | None = None) -> GroupOut:
    if members is None:
        return GroupOut.model_validate(g, from_attributes=True)
    return GroupDetail.model_validate(
        {
            **dict(GroupOut.model_validate(g, from_attributes=True)),
            "members": [m.uuid for m in members],
        }
    )


def allocations(
    records: Iterable[AllocationRecord], hosts: Mapping[str, HostRecord]
) -> dict[str, Any]:
    """Placement's ``{allocations: {rp_uuid: {generation, resources}}}``, each provider
    also split into the active and pending parts."""
    by_host: dict[str, dict[str, Any]] = {}
    for r in records:
        host = hosts[r.host]
        entry = by_host.setdefault(
            host.uuid,
            {
                "name": host.name,
                "generation": host.generation,
                "resources": {},
                "active": {},
                "pending": {},
            },
        )
        entry["resources"][r.resource_class] = (
            entry["resources"].get(r.resource_class, 0) + r.amount
        )
        entry[r.state][r.resource_class] = entry[r.state].get(r.resource_class, 0) + r.amount
    return by_host


def reconcile(result: ReconcileResult) -> dict[str, list[str]]:
    return {
        "activated": list(result.activated),
        "released": list(result.released),
        "stopped": list(result.stopped),
        "unexpected": list(result.unexpected),
    }
