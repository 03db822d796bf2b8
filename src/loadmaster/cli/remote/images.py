"""``loadmaster image ...``: the image catalogue VMs' disks are made from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from loadmaster.cli.app import api, remote_group
from loadmaster.cli.client import Exit, fail
from loadmaster.cli.output import JsonOpt, say, show
from loadmaster.errors import ValidationError
from loadmaster.images import virtual_size

image_app = remote_group("image", "Base images VMs' disks are made from.")
COLUMNS = ("name", "size_bytes", "created_at")


@image_app.command("list")
def image_list(as_json: JsonOpt = False) -> None:
    """Every registered image and the size its guests see."""
    data = api().get("/images")
    rows = [(i["name"], i["size_bytes"], i["created_at"]) for i in data["images"]]
    show(data, as_json, "Images", COLUMNS, rows)


@image_app.command("add")
def image_add(
    name: Annotated[str, typer.Argument(help="the image's name (VMs and flavors name it)")],
    file: Annotated[
        Path,
        typer.Argument(
            help="the image (qcow2 or raw), read here for its size; each host's agent "
            "finds its own copy at <--image-dir>/<name>.qcow2"
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Register an image by name with the size its guests see (a VM's DISK_GB must hold it)."""
    try:
        size = virtual_size(file)
    except ValidationError as exc:
        fail(exc.detail, Exit.USAGE)
    image = api().put(f"/images/{name}", {"size_bytes": size})
    show(
        image,
        as_json,
        "Image",
        COLUMNS,
        [(image["name"], image["size_bytes"], image["created_at"])],
    )


@image_app.command("delete")
def image_delete(name: Annotated[str, typer.Argument(help="the image")]) -> None:
    """Unregister an image no VM uses (hosts keep their copies)."""
    api().delete(f"/images/{name}")
    say(f"image {name} deleted")
