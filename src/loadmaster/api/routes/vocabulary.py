"""Resource classes and traits (Placement: ``/resource_classes``, ``/traits``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from loadmaster.api import microversion, views
from loadmaster.api.deps import LM
from loadmaster.api.schemas import ResourceClassCreate, ResourceClassFields

router = APIRouter(tags=["vocabulary"])
# The microversions that brought resource classes and traits.
SINCE_1_2 = microversion.since(1, 2)
TRAITS_SINCE = microversion.since(1, 6)


@router.get("/resource_classes", openapi_extra=SINCE_1_2)
def list_resource_classes(lm: LM) -> dict[str, Any]:
    return {"resource_classes": [views.resource_class(rc) for rc in lm.resource_classes.list()]}


@router.post("/resource_classes", status_code=201, openapi_extra=SINCE_1_2)
def create_resource_class(lm: LM, body: ResourceClassCreate) -> dict[str, Any]:
    fields = body.fields()
    return views.resource_class(lm.resource_classes.create(fields.pop("name"), **fields))


@router.get("/resource_classes/{name}", openapi_extra=SINCE_1_2)
def get_resource_class(lm: LM, name: str) -> dict[str, Any]:
    return views.resource_class(lm.resource_classes.get(name))


@router.put("/resource_classes/{name}", openapi_extra=SINCE_1_2)
def put_resource_class(
    lm: LM, name: str, body: ResourceClassFields | None = None
) -> dict[str, Any]:
    """Idempotent create, as Placement's PUT: the same fields again change nothing."""
    fields = body.fields() if body is not None else {}
    return views.resource_class(lm.resource_classes.create(name, **fields))


@router.delete("/resource_classes/{name}", status_code=204, openapi_extra=SINCE_1_2)
def delete_resource_class(lm: LM, name: str) -> Response:
    lm.resource_classes.delete(name)
    return Response(status_code=204)


@router.get("/traits", openapi_extra=TRAITS_SINCE)
def list_traits(lm: LM) -> dict[str, list[str]]:
    return {"traits": lm.traits.list()}


@router.put("/traits/{name}", status_code=204, openapi_extra=TRAITS_SINCE)
def put_trait(lm: LM, name: str) -> Response:
    lm.traits.create(name)
    return Response(status_code=204)


@router.delete("/traits/{name}", status_code=204, openapi_extra=TRAITS_SINCE)
def delete_trait(lm: LM, name: str) -> Response:
    lm.traits.delete(name)
    return Response(status_code=204)
