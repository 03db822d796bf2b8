"""Resource classes and traits (Placement: ``/resource_classes``, ``/traits``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError as PydanticValidationError

from loadmaster.api import microversion, views
from loadmaster.api.deps import LM
from loadmaster.api.errors import InvalidJson
from loadmaster.api.location import absolute
from loadmaster.api.responses import (
    PlacementClassList,
    PlacementClassOut,
    ResourceClassList,
    ResourceClassOut,
    TraitList,
)
from loadmaster.api.schemas import (
    PlacementClassCreate,
    ResourceClassCreate,
    ResourceClassFields,
    check_class_name,
)
from loadmaster.errors import NotFound, ValidationError

router = APIRouter(tags=["vocabulary"])
# The microversions that brought resource classes and traits.
SINCE_1_2 = microversion.since(1, 2)
TRAITS_SINCE = microversion.since(1, 6)


@router.get("/resource_classes", openapi_extra=SINCE_1_2, response_model=PlacementClassList)
def list_resource_classes(lm: LM) -> dict[str, Any]:
    return {
        "resource_classes": [views.placement_class(rc.name) for rc in lm.resource_classes.list()]
    }


@router.post(
    "/resource_classes",
    status_code=201,
    openapi_extra=SINCE_1_2,
    response_class=Response,
    responses={201: {"description": "Created; no body, a Location header"}},
)
def create_resource_class(lm: LM, request: Request, body: PlacementClassCreate) -> Response:
    """Placement's create: 201 with a ``Location`` and no body; 409 if it exists."""
    lm.resource_classes.create(body.name, exist_ok=False)
    return Response(status_code=201, headers=_class_location(request, body.name))


@router.get("/resource_classes/{name}", openapi_extra=SINCE_1_2, response_model=PlacementClassOut)
def get_resource_class(lm: LM, name: str) -> PlacementClassOut:
    return views.placement_class(lm.resource_classes.get(name).name)


@router.put(
    "/resource_classes/{name}",
    openapi_extra={
        **SINCE_1_2,
        "requestBody": {  # the rename's body, up to 1.6
            "content": {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/PlacementClassCreate"}
                }
            }
        },
    },
    response_model=PlacementClassOut,
    responses={201: {"description": "Created (1.7)"}, 204: {"description": "Exists (1.7)"}},
)
def put_resource_class(
    lm: LM, request: Request, name: str, body: Annotated[Any, Body()] = None
) -> Response:
    """Up to 1.6, Placement's rename (``{"name": new}``, 200 with the class); from 1.7 an
    idempotent create whose body, if any, is not read (openstacksdk's
    ``update_resource_class`` sends ``{}``): 201 if new, 204 if it was there."""
    if not microversion.current().matches(1, 7):
        if body is None:
            raise InvalidJson('Malformed JSON: a body {"name": ...} is required', field="body")
        try:
            rename = PlacementClassCreate.model_validate(body)
        except PydanticValidationError as exc:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
            ) from None
        renamed = lm.resource_classes.rename(name, rename.name)
        return JSONResponse(views.placement_class(renamed.name).model_dump())
    check_class_name(name)
    _, created = lm.resource_classes.put(name)
    return Response(status_code=201 if created else 204, headers=_class_location(request, name))


@router.delete("/resource_classes/{name}", status_code=204, openapi_extra=SINCE_1_2)
def delete_resource_class(lm: LM, name: str) -> Response:
    lm.resource_classes.delete(name)
    return Response(status_code=204)


def _class_location(request: Request, name: str) -> dict[str, str]:
    return {"location": absolute(request, f"/resource_classes/{name}")}


# loadmaster's own view of the classes, with what it adds to Placement's: a kind, a unit
# and a description. Placement's paths take Placement's bodies only.
@router.get("/classes", response_model=ResourceClassList)
def list_classes(lm: LM) -> dict[str, Any]:
    return {"classes": [views.resource_class(rc) for rc in lm.resource_classes.list()]}


@router.post("/classes", status_code=201, response_model=ResourceClassOut)
def create_class(lm: LM, body: ResourceClassCreate) -> ResourceClassOut:
    fields = body.fields()
    return views.resource_class(lm.resource_classes.create(fields.pop("name"), **fields))


@router.get("/classes/{name}", response_model=ResourceClassOut)
def get_class(lm: LM, name: str) -> ResourceClassOut:
    return views.resource_class(lm.resource_classes.get(name))


@router.put("/classes/{name}", response_model=ResourceClassOut)
def put_class(lm: LM, name: str, body: ResourceClassFields | None = None) -> ResourceClassOut:
    """Idempotent create: the same fields again change nothing; other fields are 409."""
    fields = body.fields() if body is not None else {}
    return views.resource_class(lm.resource_classes.create(name, **fields))


@router.delete("/classes/{name}", status_code=204)
def delete_class(lm: LM, name: str) -> Response:
    lm.resource_classes.delete(name)
    return Response(status_code=204)


# Placement's words for a name its schema refuses.
INVALID_TRAIT = (
    "The trait is invalid. A valid trait must be no longer than 255 characters, start with "
    'the prefix "CUSTOM_" and use following characters: "A"-"Z", "0"-"9" and "_"'
)


@router.get("/traits", openapi_extra=TRAITS_SINCE, response_model=TraitList)
def list_traits(
    lm: LM,
    name: str | None = Query(None, description="in:A,B (these) or startswith:PREFIX"),
    associated: str | None = Query(None, description="true: set on some provider; false: not"),
) -> dict[str, list[str]]:
    names: list[str] | None = None
    prefix: str | None = None
    if name is not None:
        kind, _, value = name.partition(":")
        if kind == "in" and value:
            names = value.split(",")
        elif kind == "startswith" and value:
            prefix = value
        else:
            raise ValidationError(
                "Badly formatted name parameter. Expected name query string parameter in "
                f'form: ?name=[in|startswith]:[name1,name2|prefix]. Got: "{name}"',
                field="query.name",
            )
    used: bool | None = None
    if associated is not None:
        if associated.lower() not in ("true", "false"):
            raise ValidationError(
                'The query parameter "associated" only accepts "true" or "false"',
                field="query.associated",
            )
        used = associated.lower() == "true"
    return {"traits": lm.traits.list(names=names, prefix=prefix, associated=used)}


@router.get(
    "/traits/{name}",
    status_code=204,
    openapi_extra=TRAITS_SINCE,
    responses={404: {"description": "No such trait"}},
)
def get_trait(lm: LM, name: str) -> Response:
    """204 if the trait exists: Placement shows a trait by its name alone."""
    if not lm.traits.exists(name):
        raise NotFound(f"No such trait(s): {name}.", field="name")
    return Response(status_code=204)


@router.put(
    "/traits/{name}",
    status_code=204,
    openapi_extra=TRAITS_SINCE,
    responses={201: {"description": "Created"}},
)
def put_trait(lm: LM, request: Request, name: str) -> Response:
    """Create a custom trait: 201 if new, 204 if it was there; a ``Location`` either way."""
    try:
        created = lm.traits.create(name)
    except ValidationError as exc:
        raise ValidationError(INVALID_TRAIT, field="name") from exc
    headers = {"location": absolute(request, f"/traits/{name}")}
    if microversion.current().matches(*microversion.CACHE_HEADERS_SINCE):
        headers.update(microversion.cache_headers())
    return Response(status_code=201 if created else 204, headers=headers)


@router.delete("/traits/{name}", status_code=204, openapi_extra=TRAITS_SINCE)
def delete_trait(lm: LM, name: str) -> Response:
    lm.traits.delete(name)
    return Response(status_code=204)
