"""``loadmaster group ...``: server groups."""

from __future__ import annotations

from typing import Annotated

import typer

from loadmaster.cli.app import api, remote_group
from loadmaster.cli.output import VM_COLUMNS, GroupArg, JsonOpt, say, show, vm_row

group_app = remote_group("group", "Server groups.")


@group_app.command("list")
def group_list(as_json: JsonOpt = False) -> None:
    """Every server group and its rule."""
    data = api().get("/server_groups")
    rows = [(g["name"], g["policy"], g["max_per_host"], g["uuid"]) for g in data["server_groups"]]
    show(data, as_json, "Server groups", ("name", "policy", "max/host", "uuid"), rows)


@group_app.command("show")
def group_show(group: GroupArg, as_json: JsonOpt = False) -> None:
    """A group's rule and its members: name, state, host."""
    client = api()
    g = client.get(f"/server_groups/{group}")
    members = client.get("/vms", group=g["uuid"])["vms"]
    rows = [vm_row(v) for v in members]
    title = f"Group {g['name']} ({g['policy']}): {len(rows)} members"
    show({**g, "vms": members}, as_json, title, VM_COLUMNS, rows)


@group_app.command("create")
def group_create(
    name: Annotated[str, typer.Argument(help="the new group's name")],
    policy: Annotated[
        str, typer.Option(help="affinity, anti-affinity, soft-affinity or soft-anti-affinity")
    ],
    max_per_host: Annotated[
        int | None, typer.Option(help="anti-affinity: members allowed on one host")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a server group."""
    g = api().post("/server_groups", {"name": name, "policy": policy, "max_per_host": max_per_host})
    show(
        g,
        as_json,
        "Server group created",
        ("name", "policy", "uuid"),
        [(g["name"], g["policy"], g["uuid"])],
    )


@group_app.command("delete")
def group_delete(group: GroupArg) -> None:
    """Delete a server group."""
    api().delete(f"/server_groups/{group}")
    say(f"server group {group} deleted")
