"""``loadmaster class ...`` and ``loadmaster trait ...``: the resource classes and traits
hosts carry and flavors ask for."""

from __future__ import annotations

from typing import Annotated

import typer

from loadmaster.cli.app import api, remote_group
from loadmaster.cli.output import JsonOpt, say, show

class_app = remote_group("class", "Resource classes (standard and CUSTOM_*).")
trait_app = remote_group("trait", "Traits hosts carry and flavors require or forbid.")


@class_app.command("list")
def class_list(as_json: JsonOpt = False) -> None:
    """Every resource class, standard and custom."""
    data = api().get("/classes")
    rows = [
        (c["name"], c["kind"], c["unit"], "yes" if c["standard"] else "no", c["description"])
        for c in data["classes"]
    ]
    show(data, as_json, "Resource classes", ("name", "kind", "unit", "standard", "about"), rows)


@class_app.command("show")
def class_show(
    name: Annotated[str, typer.Argument(help="the class, e.g. VCPU")], as_json: JsonOpt = False
) -> None:
    """One resource class."""
    c = api().get(f"/classes/{name}")
    show(c, as_json, f"Resource class {name}", ("field", "value"), list(c.items()))


@class_app.command("create")
def class_create(
    name: Annotated[str, typer.Argument(help="CUSTOM_<NAME>: upper case, digits and _")],
    kind: Annotated[str, typer.Option(help="e.g. custom, accelerator")] = "custom",
    unit: Annotated[str, typer.Option(help="what one unit is, e.g. gpu, MiB")] = "unit",
    description: Annotated[str, typer.Option(help="a sentence for people")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Create a custom resource class."""
    body = {"name": name, "kind": kind, "unit": unit, "description": description}
    c = api().post("/classes", body)
    show(c, as_json, "Resource class created", ("name", "kind", "unit"), [(name, kind, unit)])


@class_app.command("delete")
def class_delete(name: Annotated[str, typer.Argument(help="the custom class")]) -> None:
    """Delete a custom class no host has in its inventory."""
    api().delete(f"/classes/{name}")
    say(f"resource class {name} deleted")


@trait_app.command("list")
def trait_list(
    custom: Annotated[
        bool, typer.Option("--custom", help="only the custom traits (CUSTOM_*), not the standard")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Every trait, standard (os-traits) and custom."""
    from loadmaster.resources.classes import CUSTOM_PREFIX

    # The server filters, as Placement's ?name=startswith: does for openstack clients.
    data = api().get("/traits", **({"name": f"startswith:{CUSTOM_PREFIX}"} if custom else {}))
    show(data, as_json, "Traits", ("name",), [(t,) for t in data["traits"]])


@trait_app.command("create")
def trait_create(
    name: Annotated[str, typer.Argument(help="CUSTOM_<NAME>: upper case, digits and _")],
) -> None:
    """Create a custom trait (creating it again is harmless)."""
    api().put(f"/traits/{name}")
    say(f"trait {name} created")


@trait_app.command("delete")
def trait_delete(name: Annotated[str, typer.Argument(help="the custom trait")]) -> None:
    """Delete a custom trait no host carries."""
    api().delete(f"/traits/{name}")
    say(f"trait {name} deleted")
