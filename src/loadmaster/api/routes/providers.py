"""Hosts as Placement resource providers: inventories, traits, aggregates, usages.

Every write to one of a provider's sets carries ``resource_provider_generation``; a stale
one gets 409 ``loadmaster.concurrent_update`` and the client re-reads and retries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from loadmaster.api import microversion, queries, views
from loadmaster.api.deps import LM
from loadmaster.api.location import absolute
from loadmaster.api.responses import (
    AggregatesOut,
    InventoriesOut,
    OneInventoryOut,
    ProviderList,
    ProviderOut,
    ProviderTraitsOut,
    ProviderUsagesOut,
)
from loadmaster.api.routes.vocabulary import TRAITS_SINCE
from loadmaster.api.schemas import (
    AggregatesPut,
    InventoriesPut,
    InventoryPost,
    InventoryPut,
    Name,
    ProviderCreate,
    ProviderPut,
    TraitsPut,
)
from loadmaster.cluster.records import HostRecord
from loadmaster.errors import NotFound, ValidationError
from loadmaster.resources import Inventory
from loadmaster.service import Loadmaster

router = APIRouter(tags=["resource providers"])


@contextmanager
def _placement_words(action: str, provider: str) -> Iterator[None]:
    """An inventory the rules refuse is told in Placement's words (its clients look for
    them) followed by loadmaster's reason."""
    try:
        yield
    except ValidationError as exc:
        exc.detail = f"{action} {provider}: {exc.detail}"
        raise
    except NotFound as exc:
        if not (exc.field or "").startswith("inventories."):
            raise
        name = (exc.field or "").removeprefix("inventories.")
        raise ValidationError(
            f"Unknown resource class in inventory for resource provider {provider}: {name}. "
            f"No such resource class {name}.",
            field=exc.field,
        ) from None


def _reserved_below_total(inventories: Mapping[str, Inventory], action: str, provider: str) -> None:
    """Before 1.26 an inventory had to keep some capacity: reserved below total."""
    if microversion.current().matches(*RESERVED_EQUAL_TOTAL_SINCE):
        return
    for name, inventory in inventories.items():
        if inventory.reserved >= inventory.total:
            raise ValidationError(
                f"{action} {provider}: Invalid inventory for '{name}' on resource provider "
                f"'{provider}'. The reserved value is greater than or equal to total.",
                field=f"inventories.{name}.reserved",
            )


def _write_one(
    lm: Loadmaster,
    provider: str,
    resource_class: str,
    inventory: Inventory,
    generation: int | None,
    only: Literal["new", "existing"],
) -> HostRecord:
    """One class's inventory written by POST (``new``) or PUT (``existing``)."""
    action = CREATE_INVENTORY if only == "new" else UPDATE_INVENTORY
    _reserved_below_total({resource_class: inventory}, action, provider)
    with _placement_words(action, provider):
        return lm.hosts.set_inventory(
            provider, resource_class, inventory, generation=generation, only=only
        )


PROVIDER = "/resource_providers/{provider}"
AGGREGATES_SINCE = microversion.since(1, 1)
AGGREGATES_GENERATION_SINCE = (1, 19)
PROVIDER_BODY_SINCE = (1, 20)
REPARENT_SINCE = (1, 37)
RESERVED_EQUAL_TOTAL_SINCE = (1, 26)
CREATE_INVENTORY = "Unable to create inventory for resource provider"
UPDATE_INVENTORY = "Unable to update inventory for resource provider"


@router.get("/resource_providers", response_model=ProviderList, response_model_exclude_unset=True)
def list_providers(
    lm: LM,
    name: str | None = None,
    uuid: str | None = None,
    member_of: list[str] = Query(
        [], description="aggregate uuid, in:A,B (any), !A or !in:A,B (none); repeated: all"
    ),
    in_tree: str | None = Query(None, description="only providers in this provider's tree"),
    required: list[str] = Query(
        [], description="traits: A,B (all), !A (not), in:A,B (any of them)"
    ),
    resources: str | None = Query(
        None, description="VCPU:2,MEMORY_MB:1024: room for these amounts, pending counted"
    ),
) -> dict[str, Any]:
    version = microversion.current()
    amounts = queries.resources(resources, version, {rc.name for rc in lm.resource_classes.list()})
    room = _room_for(lm, amounts)
    wanted = queries.member_of(member_of, version)
    traits = queries.required(required, version)
    queries.known_traits(traits.names(), set(lm.traits.list(names=traits.names())))
    wanted_uuid = queries.uuid_param(uuid, "uuid") if uuid is not None else None
    tree: str | None = None
    if in_tree is not None:
        if not version.matches(*queries.IN_TREE_SINCE):
            raise queries.too_new("in_tree")
        tree = queries.uuid_param(in_tree, "in_tree")
    hosts = lm.hosts.list(name=name, uuid=wanted_uuid, in_tree=tree, by_creation=True)
    return {
        "resource_providers": [
            views.provider(h, version)
            for h in hosts
            if wanted.admits({a.lower() for a in h.aggregates})
            and traits.admits(set(h.traits))
            and room(h)
        ]
    }


def _room_for(lm: LM, amounts: Mapping[str, int]) -> Callable[[HostRecord], bool]:
    """Whether a provider itself can take every amount now: its unit rules allow it and
    its capacity less what is used, pending claims included, holds it (Placement counts
    only what it has allocated; loadmaster counts what is on its way too)."""
    if not amounts:
        return lambda _host: True
    usages = lm.allocations.usages()

    def fits(host: HostRecord) -> bool:
        used = usages.get(host.name, {})
        for name, amount in amounts.items():
            inventory = host.inventories.get(name)
            usage = used.get(name)
            if inventory is None or usage is None:
                return False
            if inventory.room_problem(amount, usage.active + usage.pending) is not None:
                return False
        return True

    return fits


@router.post(
    "/resource_providers",
    response_model=ProviderOut,
    response_model_exclude_unset=True,
    responses={201: {"description": "Created; no body (microversions before 1.20)"}},
)
def create_provider(lm: LM, request: Request, body: ProviderCreate) -> Response | dict[str, Any]:
    """Placement's answer: 201 with no body before microversion 1.20, then 200 with the
    provider; a ``Location`` either way."""
    version = microversion.current()
    fields = body.fields()
    parent = fields.pop("parent_provider_uuid", None)
    if "parent_provider_uuid" in body.model_fields_set and not version.matches(*views.PARENT_SINCE):
        raise queries.body_too_new("parent_provider_uuid")
    if body.uuid is not None:
        fields["uuid"] = queries.body_uuid(body.uuid, "uuid")
    host = lm.hosts.create(fields.pop("name"), parent=parent, **fields)
    location = {"location": absolute(request, f"/resource_providers/{host.uuid}")}
    if version.matches(*PROVIDER_BODY_SINCE):
        return JSONResponse(
            views.provider(host, version).model_dump(exclude_unset=True), headers=location
        )
    return Response(status_code=201, headers=location)


@router.get(PROVIDER, response_model=ProviderOut, response_model_exclude_unset=True)
def get_provider(lm: LM, provider: str) -> ProviderOut:
    """``provider`` is a uuid (or, for loadmaster's callers, a name)."""
    return views.provider(lm.hosts.get(provider), microversion.current())


@router.put(PROVIDER, response_model=ProviderOut, response_model_exclude_unset=True)
def update_provider(lm: LM, provider: str, body: ProviderPut) -> ProviderOut:
    """Rename the provider, give it a parent (from 1.14), move it to another parent or
    make it a root (from 1.37)."""
    version = microversion.current()
    host = lm.hosts.get(provider)
    parent = host.parent
    if "parent_provider_uuid" in body.model_fields_set:
        if not version.matches(*views.PARENT_SINCE):
            raise queries.body_too_new("parent_provider_uuid")
        parent = body.parent_provider_uuid
        if (
            host.parent is not None
            and parent != host.parent
            and not version.matches(*REPARENT_SINCE)
        ):
            what = "un-parenting" if parent is None else "re-parenting"
            raise ValidationError(
                f"{what} a provider is not currently allowed.", field="parent_provider_uuid"
            )
    return views.provider(lm.hosts.update(host.uuid, body.name, parent), version)


@router.delete(PROVIDER, status_code=204)
def delete_provider(lm: LM, provider: str) -> Response:
    try:
        lm.hosts.delete(provider)
    except NotFound as exc:
        exc.placement_detail = f"{exc.placement_detail or exc.detail} for delete"
        raise
    return Response(status_code=204)


@router.get(PROVIDER + "/inventories", response_model=InventoriesOut)
def get_inventories(lm: LM, provider: str) -> InventoriesOut:
    return views.inventories(lm.hosts.get(provider))


@router.post(PROVIDER + "/inventories", status_code=201, response_model=OneInventoryOut)
def post_inventory(
    lm: LM, request: Request, provider: str, body: InventoryPost, response: Response
) -> OneInventoryOut:
    """Add one class's inventory; 409 if the provider has one already."""
    resource_class = body.resource_class
    # The generation is optional here, unlike Placement's other inventory writes.
    host = _write_one(lm, provider, resource_class, body, body.resource_provider_generation, "new")
    response.headers["location"] = absolute(
        request, f"/resource_providers/{host.uuid}/inventories/{resource_class}"
    )
    return views.inventory_of(host, resource_class)


@router.put(PROVIDER + "/inventories", response_model=InventoriesOut)
def put_inventories(lm: LM, provider: str, body: InventoriesPut) -> InventoriesOut:
    _reserved_below_total(body.inventories, UPDATE_INVENTORY, provider)
    with _placement_words(UPDATE_INVENTORY, provider):
        host = lm.hosts.set_inventories(
            provider, body.inventories, generation=body.resource_provider_generation
        )
    return views.inventories(host)


@router.delete(PROVIDER + "/inventories", status_code=204, openapi_extra=microversion.since(1, 5))
def delete_inventories(lm: LM, provider: str) -> Response:
    """Remove every inventory (refused while any is allocated from)."""
    lm.hosts.set_inventories(provider, {})
    return Response(status_code=204)


@router.get(PROVIDER + "/inventories/{resource_class}", response_model=OneInventoryOut)
def get_inventory(lm: LM, provider: str, resource_class: str) -> OneInventoryOut:
    host = lm.hosts.get(provider)
    if resource_class not in host.inventories:
        raise NotFound(
            f"No inventory of class {resource_class} for {host.uuid} (host {host.name})",
            field="resource_class",
        )
    return views.inventory_of(host, resource_class)


@router.put(PROVIDER + "/inventories/{resource_class}", response_model=OneInventoryOut)
def put_inventory(
    lm: LM, provider: str, resource_class: str, body: InventoryPut
) -> OneInventoryOut:
    """Replace the inventory of a class the provider has (400 if it has none)."""
    host = _write_one(
        lm, provider, resource_class, body, body.resource_provider_generation, "existing"
    )
    return views.inventory_of(host, resource_class)


@router.delete(PROVIDER + "/inventories/{resource_class}", status_code=204)
def delete_inventory(
    lm: LM, provider: str, resource_class: str, resource_provider_generation: int | None = None
) -> Response:
    lm.hosts.delete_inventory(provider, resource_class, generation=resource_provider_generation)
    return Response(status_code=204)


@router.get(PROVIDER + "/traits", openapi_extra=TRAITS_SINCE, response_model=ProviderTraitsOut)
def get_traits(lm: LM, provider: str) -> dict[str, Any]:
    host = lm.hosts.get(provider)
    return {"resource_provider_generation": host.generation, "traits": list(host.traits)}


@router.put(PROVIDER + "/traits", openapi_extra=TRAITS_SINCE, response_model=ProviderTraitsOut)
def put_traits(lm: LM, provider: str, body: TraitsPut) -> dict[str, Any]:
    lm.hosts.get(provider)  # an unknown provider is 404 before its body's traits are read
    unknown = sorted(set(body.traits) - set(lm.traits.list(names=body.traits)))
    if unknown:
        raise ValidationError(f"No such trait(s): {', '.join(unknown)}", field="traits")
    host = lm.hosts.set_traits(provider, body.traits, generation=body.resource_provider_generation)
    return {"resource_provider_generation": host.generation, "traits": list(host.traits)}


@router.delete(PROVIDER + "/traits", status_code=204, openapi_extra=TRAITS_SINCE)
def delete_traits(lm: LM, provider: str) -> Response:
    """Every trait off the provider; its generation moves (no compare-and-swap: Placement
    takes none here)."""
    lm.hosts.set_traits(provider, [])
    return Response(status_code=204)


@router.get(
    PROVIDER + "/aggregates",
    openapi_extra=AGGREGATES_SINCE,
    response_model=AggregatesOut,
    response_model_exclude_unset=True,
)
def get_aggregates(lm: LM, provider: str) -> dict[str, Any]:
    return _aggregates_view(lm.hosts.get(provider))


@router.put(
    PROVIDER + "/aggregates",
    openapi_extra=AGGREGATES_SINCE,
    response_model=AggregatesOut,
    response_model_exclude_unset=True,
)
def put_aggregates(lm: LM, provider: str, body: AggregatesPut | list[Name]) -> dict[str, Any]:
    """Before 1.19 the body is the list of aggregate uuids; from 1.19 it is an object with
    the provider generation, compared and swapped."""
    lm.hosts.get(provider)  # an unknown provider is 404 before its body is judged
    with_generation = microversion.current().matches(*AGGREGATES_GENERATION_SINCE)
    if isinstance(body, list) == with_generation:
        wanted = "object" if with_generation else "array"
        raise ValidationError(
            f"JSON does not validate: the body is not of type {wanted!r} at this "
            "microversion. Failed validating 'type'",
            field="body",
        )
    aggregates = body if isinstance(body, list) else body.aggregates
    generation = None if isinstance(body, list) else body.resource_provider_generation
    uuids = [queries.body_uuid(a, f"aggregates[{i}]") for i, a in enumerate(aggregates)]
    if len(set(uuids)) != len(uuids):
        raise ValidationError(
            f"JSON does not validate: {aggregates!r} has non-unique elements. Failed "
            "validating 'uniqueItems'",
            field="aggregates",
        )
    host = lm.hosts.set_aggregates(provider, uuids, generation=generation, bump=with_generation)
    return _aggregates_view(host, uuids)  # in the order written, as Placement echoes them


def _aggregates_view(host: HostRecord, aggregates: Sequence[str] | None = None) -> dict[str, Any]:
    view: dict[str, Any] = {
        "aggregates": list(host.aggregates if aggregates is None else aggregates)
    }
    if microversion.current().matches(*AGGREGATES_GENERATION_SINCE):
        view["resource_provider_generation"] = host.generation
    return view


@router.get(PROVIDER + "/usages", response_model=ProviderUsagesOut)
def get_usages(lm: LM, provider: str) -> dict[str, Any]:
    """Placement's ``usages``: used per class, pending counted (the split of each into
    active and pending is loadmaster's ``GET /hosts/{host}/usages``)."""
    host = lm.hosts.get(provider)
    split = views.usage(lm.hosts.usage(host.uuid))
    return {
        "resource_provider_generation": host.generation,
        "usages": {name: u.used for name, u in split.items()},
    }
