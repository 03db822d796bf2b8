"""Flavors, images and server groups: what VMs are made from and kept together or apart by."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from loadmaster.api import views
from loadmaster.api.deps import LM
from loadmaster.api.responses import (
    FlavorList,
    FlavorOut,
    GroupDetail,
    GroupList,
    GroupOut,
    ImageList,
    ImageOut,
)
from loadmaster.api.schemas import FlavorCreate, GroupCreate, ImagePut

router = APIRouter()


@router.get("/flavors", tags=["flavors"], response_model=FlavorList)
def list_flavors(lm: LM) -> dict[str, Any]:
    return {"flavors": [views.flavor(f) for f in lm.flavors.list()]}


@router.post("/flavors", status_code=201, tags=["flavors"], response_model=FlavorOut)
def create_flavor(lm: LM, body: FlavorCreate) -> FlavorOut:
    definition = body.fields()
    unknown_specs = definition.pop("unknown_specs", None)
    return views.flavor(lm.flavors.create(definition, unknown_specs=unknown_specs))


@router.get("/flavors/{name}", tags=["flavors"], response_model=FlavorOut)
def get_flavor(lm: LM, name: str) -> FlavorOut:
    return views.flavor(lm.flavors.get(name))


@router.delete("/flavors/{name}", status_code=204, tags=["flavors"])
def delete_flavor(lm: LM, name: str) -> Response:
    lm.flavors.delete(name)
    return Response(status_code=204)


@router.get("/images", tags=["images"], response_model=ImageList)
def list_images(lm: LM) -> dict[str, Any]:
    return {"images": [views.image(i) for i in lm.images.list()]}


@router.put(
    "/images/{name}",
    tags=["images"],
    response_model=ImageOut,
    responses={201: {"model": ImageOut, "description": "registered now"}},
)
def put_image(lm: LM, name: str, body: ImagePut) -> JSONResponse:
    """Register a base image by name and size (its file reaches each host through the
    host agent's image directory); the same again is 200, another size 409."""
    record, new = lm.images.put(name, body.size_bytes)
    return JSONResponse(views.image(record).model_dump(), status_code=201 if new else 200)


@router.get("/images/{name}", tags=["images"], response_model=ImageOut)
def get_image(lm: LM, name: str) -> ImageOut:
    return views.image(lm.images.get(name))


@router.delete("/images/{name}", status_code=204, tags=["images"])
def delete_image(lm: LM, name: str) -> Response:
    lm.images.delete(name)
    return Response(status_code=204)


@router.get("/server_groups", tags=["server groups"], response_model=GroupList)
def list_groups(lm: LM) -> dict[str, Any]:
    return {"server_groups": [views.group(g) for g in lm.groups.list()]}


@router.post("/server_groups", status_code=201, tags=["server groups"], response_model=GroupDetail)
def create_group(lm: LM, body: GroupCreate) -> GroupOut:
    group = lm.groups.create(body.name, body.policy, max_per_host=body.max_per_host)
    return views.group(group, members=[])


@router.get("/server_groups/{group}", tags=["server groups"], response_model=GroupDetail)
def get_group(lm: LM, group: str) -> GroupOut:
    """``group`` is a uuid or a name; ``members`` lists the live VMs' uuids."""
    return views.group(lm.groups.get(group), members=lm.groups.members(group))


@router.delete("/server_groups/{group}", status_code=204, tags=["server groups"])
def delete_group(lm: LM, group: str) -> Response:
    lm.groups.delete(group)
    return Response(status_code=204)
