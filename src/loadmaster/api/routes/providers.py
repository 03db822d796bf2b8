"""Hosts as Placement resource providers: inventories, traits, aggregates, usages.

Every write to one of a provider's sets carries ``resource_provider_generation``; a stale
one gets 409 ``loadmaster.concurrent_update`` and the client re-reads and retries.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Response

from loadmaster.api import views
from loadmaster.api.deps import LM
from loadmaster.api.schemas import (
    AggregatesPut,
    HostReport,
    InventoriesPut,
    InventoryPut,
    ProviderCreate,
    ProviderUpdate,
    TraitsPut,
)
from loadmaster.errors import NotFound
from loadmaster.pending.ledger import check_as_of

router = APIRouter(tags=["resource providers"])
PROVIDER = "/resource_providers/{provider}"


@router.get("/resource_providers")
def list_providers(
    lm: LM,
    state: str | None = None,
    member_of: str | None = Query(None, description="only hosts in this aggregate"),
) -> dict[str, Any]:
    hosts = lm.hosts.list(state=state, aggregate=member_of)
    return {"resource_providers": [views.provider(h) for h in hosts]}


@router.post("/resource_providers", status_code=201)
def create_provider(lm: LM, body: ProviderCreate) -> dict[str, Any]:
    fields = body.fields()
    parent = fields.pop("parent_provider_uuid", None)
    return views.provider(lm.hosts.create(fields.pop("name"), parent=parent, **fields))


@router.get(PROVIDER)
def get_provider(lm: LM, provider: str) -> dict[str, Any]:
    """``provider`` is a uuid or a name."""
    return views.provider(lm.hosts.get(provider))


@router.put(PROVIDER)
def update_provider(lm: LM, provider: str, body: ProviderUpdate) -> dict[str, Any]:
    """Change the host's state (up, maintenance, down)."""
    return views.provider(
        lm.hosts.set_state(provider, body.state, generation=body.resource_provider_generation)
    )


@router.delete(PROVIDER, status_code=204)
def delete_provider(lm: LM, provider: str) -> Response:
    lm.hosts.delete(provider)
    return Response(status_code=204)


@router.get(PROVIDER + "/inventories")
def get_inventories(lm: LM, provider: str) -> dict[str, Any]:
    return views.inventories(lm.hosts.get(provider))


@router.put(PROVIDER + "/inventories")
def put_inventories(lm: LM, provider: str, body: InventoriesPut) -> dict[str, Any]:
    wanted = {name: inv.fields() for name, inv in body.inventories.items()}
    host = lm.hosts.set_inventories(provider, wanted, generation=body.resource_provider_generation)
    return views.inventories(host)


@router.get(PROVIDER + "/inventories/{resource_class}")
def get_inventory(lm: LM, provider: str, resource_class: str) -> dict[str, Any]:
    host = lm.hosts.get(provider)
    inventories = views.inventories(host)["inventories"]
    if resource_class not in inventories:
        raise NotFound(
            f"host {host.name} has no {resource_class} inventory", field="resource_class"
        )
    return {"resource_provider_generation": host.generation, **inventories[resource_class]}


@router.put(PROVIDER + "/inventories/{resource_class}")
def put_inventory(lm: LM, provider: str, resource_class: str, body: InventoryPut) -> dict[str, Any]:
    fields = body.fields()
    generation = fields.pop("resource_provider_generation")
    host = lm.hosts.set_inventory(provider, resource_class, fields, generation=generation)
    return views.inventories(host)


@router.delete(PROVIDER + "/inventories/{resource_class}")
def delete_inventory(
    lm: LM, provider: str, resource_class: str, resource_provider_generation: int | None = None
) -> dict[str, Any]:
    host = lm.hosts.delete_inventory(
        provider, resource_class, generation=resource_provider_generation
    )
    return views.inventories(host)


@router.get(PROVIDER + "/traits")
def get_traits(lm: LM, provider: str) -> dict[str, Any]:
    host = lm.hosts.get(provider)
    return {"resource_provider_generation": host.generation, "traits": list(host.traits)}


@router.put(PROVIDER + "/traits")
def put_traits(lm: LM, provider: str, body: TraitsPut) -> dict[str, Any]:
    host = lm.hosts.set_traits(provider, body.traits, generation=body.resource_provider_generation)
    return {"resource_provider_generation": host.generation, "traits": list(host.traits)}


@router.get(PROVIDER + "/aggregates")
def get_aggregates(lm: LM, provider: str) -> dict[str, Any]:
    host = lm.hosts.get(provider)
    return {"resource_provider_generation": host.generation, "aggregates": list(host.aggregates)}


@router.put(PROVIDER + "/aggregates")
def put_aggregates(lm: LM, provider: str, body: AggregatesPut) -> dict[str, Any]:
    host = lm.hosts.set_aggregates(
        provider, body.aggregates, generation=body.resource_provider_generation
    )
    return {"resource_provider_generation": host.generation, "aggregates": list(host.aggregates)}


@router.get(PROVIDER + "/usages")
def get_usages(lm: LM, provider: str) -> dict[str, Any]:
    """Placement's ``usages`` (used per class, pending counted), plus the split."""
    host = lm.hosts.get(provider)
    split = views.usage(lm.hosts.usage(host.uuid))
    return {
        "resource_provider_generation": host.generation,
        "usages": {name: u["used"] for name, u in split.items()},
        "classes": split,
    }


@router.post("/hosts/{host_name}/report")
def host_report(lm: LM, host_name: str, body: HostReport) -> dict[str, Any]:
    """An agent's report: stored for the load weigher, then the ledger is reconciled
    with the VMs the host really runs (pending ones seen there become active)."""
    # Checked before the report is stored: a refused as_of must leave nothing behind.
    as_of = check_as_of(body.as_of)
    lm.scheduler.record_report(host_name, body.usage, body.load, body.running_vms)
    return views.reconcile(lm.allocations.reconcile(host_name, body.running_vms, as_of=as_of))
