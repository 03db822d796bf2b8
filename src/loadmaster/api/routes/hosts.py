"""loadmaster's own view of hosts: state, traits and aggregates with the provider, created
with inventories in one call (one host: ``GET /hosts/{host_name}``, with its drain status, in
``maintenance``). Placement's paths (``/resource_providers``) answer
Placement's representation only, which OpenStack's clients check exactly."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from loadmaster.api import views
from loadmaster.api.deps import LM
from loadmaster.api.responses import HostClassUsages, HostDevicesOut, HostList, HostOut
from loadmaster.api.schemas import (
    HostAggregatesPut,
    HostCreate,
    HostsCreate,
    HostTraitsPut,
    HostUpdate,
)

router = APIRouter(tags=["hosts"])


@router.get("/hosts", response_model=HostList)
def list_hosts(
    lm: LM,
    state: str | None = None,
    member_of: str | None = Query(None, description="only hosts in this aggregate"),
    in_tree: str | None = Query(
        None, description="only the providers of the tree this host (name or uuid) is in"
    ),
) -> dict[str, Any]:
    tree = lm.hosts.get(in_tree).uuid if in_tree is not None else None
    hosts = lm.hosts.list(state=state, aggregate=member_of, in_tree=tree)
    return {"hosts": [views.host(h) for h in hosts]}


@router.post("/hosts", status_code=201, response_model=HostOut)
def create_host(lm: LM, body: HostCreate) -> HostOut:
    fields = body.fields()
    parent = fields.pop("parent_provider_uuid", None)
    return views.host(lm.hosts.create(fields.pop("name"), parent=parent, **fields))


@router.post("/bulk/hosts", status_code=201, response_model=HostList)
def create_hosts(lm: LM, body: HostsCreate) -> HostList:
    """Many root hosts in one transaction, each checked as ``POST /hosts`` checks one:
    all of them, or on any refusal (naming ``hosts[i].field``) none."""
    created = lm.hosts.create_many([host.fields() for host in body.hosts])
    return HostList(hosts=[views.host(h) for h in created])


@router.put("/hosts/{host_name}", response_model=HostOut)
def update_host(lm: LM, host_name: str, body: HostUpdate) -> HostOut:
    """Change the host's state (up, maintenance, down)."""
    return views.host(
        lm.hosts.set_state(host_name, body.state, generation=body.resource_provider_generation)
    )


@router.put("/hosts/{host_name}/traits", response_model=HostOut)
def set_host_traits(lm: LM, host_name: str, body: HostTraitsPut) -> HostOut:
    """Replace the host's traits; with ``resource_provider_generation``, only if the host
    is still as the caller read it."""
    generation = body.resource_provider_generation
    return views.host(lm.hosts.set_traits(host_name, body.traits, generation=generation))


@router.put("/hosts/{host_name}/aggregates", response_model=HostOut)
def set_host_aggregates(lm: LM, host_name: str, body: HostAggregatesPut) -> HostOut:
    """Replace the host's aggregates, by name (``rack-1``) or uuid: loadmaster's own
    aggregates need not be uuids, as Placement's must."""
    generation = body.resource_provider_generation
    return views.host(lm.hosts.set_aggregates(host_name, body.aggregates, generation=generation))


@router.get("/hosts/{host_name}/usages", response_model=HostClassUsages)
def host_usages(lm: LM, host_name: str) -> HostClassUsages:
    """Per class: capacity, and what is used split into active and pending records."""
    host = lm.hosts.get(host_name)
    return HostClassUsages(
        resource_provider_generation=host.generation,
        classes=views.usage(lm.hosts.usage(host.uuid)),
    )


@router.get("/hosts/{host_name}/devices", response_model=HostDevicesOut)
def host_devices(lm: LM, host_name: str) -> dict[str, Any]:
    """The host's device providers (PFs, GPUs): class, traits, usage, and which VMs hold
    them, with the devices each one's agent gave it."""
    return {"devices": [d.to_dict() for d in lm.devices.of_host(host_name)]}
