"""Records to JSON, in Placement's shapes where the concept is Placement's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from loadmaster.cluster import (
    AllocationRecord,
    ClassUsage,
    FlavorRecord,
    GroupRecord,
    HostRecord,
    VmRecord,
)
from loadmaster.microversions import Version
from loadmaster.pending import ReconcileResult
from loadmaster.resources import ResourceClass


def resource_class(rc: ResourceClass) -> dict[str, Any]:
    return {
        "name": rc.name,
        "kind": rc.kind,
        "unit": rc.unit,
        "description": rc.description,
        "standard": rc.standard,
    }


def placement_class(name: str) -> dict[str, Any]:
    """Placement's representation of a resource class."""
    return {"name": name, "links": [{"rel": "self", "href": f"/resource_classes/{name}"}]}


def host(host: HostRecord) -> dict[str, Any]:
    """loadmaster's view of a host (``/hosts``)."""
    return {
        "uuid": host.uuid,
        "name": host.name,
        "generation": host.generation,
        "state": host.state,
        "parent_provider_uuid": host.parent,
        "root_provider_uuid": host.root,
        "traits": list(host.traits),
        "aggregates": list(host.aggregates),
    }


# Placement's links of a provider, each from the microversion that brought its path.
_PROVIDER_LINKS = (
    ("inventories", (1, 0)),
    ("usages", (1, 0)),
    ("aggregates", (1, 1)),
    ("traits", (1, 6)),
    ("allocations", (1, 11)),
)
PARENT_SINCE = (1, 14)


def provider(host: HostRecord, version: Version) -> dict[str, Any]:
    """Placement's representation of a resource provider at ``version``: exactly these
    keys, since Placement's clients and tests check them all."""
    base = f"/resource_providers/{host.uuid}"
    links = [{"rel": "self", "href": base}]
    links += [
        {"rel": rel, "href": f"{base}/{rel}"}
        for rel, since in _PROVIDER_LINKS
        if version.matches(*since)
    ]
    body: dict[str, Any] = {
        "uuid": host.uuid,
        "name": host.name,
        "generation": host.generation,
        "links": links,
    }
    if version.matches(*PARENT_SINCE):
        body["parent_provider_uuid"] = host.parent
        body["root_provider_uuid"] = host.root
    return body


def inventories(host: HostRecord) -> dict[str, Any]:
    """Placement's inventory set (capacity is in loadmaster's usage views)."""
    return {
        "resource_provider_generation": host.generation,
        "inventories": {name: inv.as_dict() for name, inv in sorted(host.inventories.items())},
    }


def inventory_of(host: HostRecord, resource_class: str) -> dict[str, Any]:
    """Placement's one inventory: its fields and the provider's generation."""
    return {
        "resource_provider_generation": host.generation,
        **host.inventories[resource_class].as_dict(),
    }


def usage(usages: Mapping[str, ClassUsage]) -> dict[str, dict[str, int]]:
    return {
        name: {
            "capacity": u.capacity,
            "active": u.active,
            "pending": u.pending,
            "used": u.used,
            "free": u.free,
        }
        for name, u in sorted(usages.items())
    }


def flavor(f: FlavorRecord) -> dict[str, Any]:
    return {
        "name": f.name,
        "resources": dict(f.resources),
        "required_traits": list(f.required_traits),
        "forbidden_traits": list(f.forbidden_traits),
        "extra_specs": dict(f.extra_specs),
        "warnings": list(f.warnings),
    }


def vm(v: VmRecord) -> dict[str, Any]:
    return {
        "uuid": v.uuid,
        "name": v.name,
        "project_id": v.project_id,
        "user_id": v.user_id,
        "flavor": v.flavor,
        "state": v.state,
        "host": v.host,
        "target_host": v.target_host,
        "group": v.group,
        "tags": list(v.tags),
        "resources": dict(v.resources),
        "overrides": dict(v.overrides),
        "generation": v.generation,
        "fault": v.fault,
        "created_at": v.created_at.isoformat(),
        "updated_at": v.updated_at.isoformat(),
    }


def group(g: GroupRecord, members: Iterable[VmRecord] | None = None) -> dict[str, Any]:
    body = g.to_dict()
    if members is not None:
        body["members"] = [m.uuid for m in members]
    return body


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
    return {key: list(values) for key, values in asdict(result).items()}
