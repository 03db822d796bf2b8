"""``loadmaster flavor ...``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from loadmaster.cli.app import api, remote_group
from loadmaster.cli.client import err_console
from loadmaster.cli.output import JsonOpt, cell, pairs, resource_amounts, say, show

flavor_app = remote_group("flavor", "Flavors.")


@flavor_app.command("list")
def flavor_list(as_json: JsonOpt = False) -> None:
    """Every flavor: what it asks for, requires and forbids."""
    data = api().get("/flavors")
    rows = [
        (f["name"], f["resources"], f["required_traits"], f["forbidden_traits"])
        for f in data["flavors"]
    ]
    show(data, as_json, "Flavors", ("name", "resources", "requires", "forbids"), rows)


@flavor_app.command("show")
def flavor_show(
    name: Annotated[str, typer.Argument(help="the flavor")], as_json: JsonOpt = False
) -> None:
    """One flavor with its extra specs."""
    f = api().get(f"/flavors/{name}")
    rows = [(k, cell(v)) for k, v in f.items()]
    show(f, as_json, f"Flavor {name}", ("field", "value"), rows)


@flavor_app.command("create")
def flavor_create(
    name: Annotated[str, typer.Argument(help="the new flavor's name")],
    resource: Annotated[
        list[str] | None,
        typer.Option(
            "--resource",
            "-r",
            help="CLASS=AMOUNT each VM asks for (or give resources:CLASS=N extra specs)",
        ),
    ] = None,
    require: Annotated[list[str] | None, typer.Option(help="required trait")] = None,
    forbid: Annotated[list[str] | None, typer.Option(help="forbidden trait")] = None,
    extra_spec: Annotated[list[str] | None, typer.Option(help="Nova-style KEY=VALUE")] = None,
    unknown_specs: Annotated[
        str | None,
        typer.Option(
            help="an extra spec loadmaster does not know: refuse the flavor, or warn "
            "(default: the server's setting, refuse unless changed)"
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a flavor: the resources, traits and extra specs of its VMs."""
    body: dict[str, Any] = {
        "name": name,
        "resources": resource_amounts(resource or [], "--resource"),
        "required_traits": require or [],
        "forbidden_traits": forbid or [],
        "extra_specs": pairs(extra_spec or [], "--extra-spec"),
    }
    if unknown_specs is not None:
        body["unknown_specs"] = unknown_specs
    f = api().post("/flavors", body)
    show(f, as_json, "Flavor created", ("name", "resources"), [(f["name"], f["resources"])])
    if not as_json:
        for warning in f.get("warnings", []):
            err_console().print(f"warning: {warning}", markup=False)


@flavor_app.command("delete")
def flavor_delete(name: Annotated[str, typer.Argument(help="the flavor")]) -> None:
    """Delete a flavor (VMs made from it keep their resources)."""
    api().delete(f"/flavors/{name}")
    say(f"flavor {name} deleted")
