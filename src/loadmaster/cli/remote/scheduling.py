"""``loadmaster usage``, ``schedule``, ``capacity``, ``policies`` and the audit: questions
to the scheduler and the ledger."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from loadmaster.cli.app import RemoteCommand, api, app
from loadmaster.cli.client import Exit, fail, format_explanation, print_json
from loadmaster.cli.output import JsonOpt, say, show
from loadmaster.cli.remote.vms import vm_uuid


@app.command("usage", cls=RemoteCommand)
def usage(
    project: Annotated[str | None, typer.Option(help="one project's totals instead")] = None,
    resource_class: Annotated[str, typer.Option("--class", help="class to show per host")] = "VCPU",
    top: Annotated[int, typer.Option(help="show the N fullest hosts (0: all)")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Per host: capacity, active, pending and free of one class (pending counts as used)."""
    client = api()
    if project is not None:
        data = client.get("/usages", project_id=project)
        rows = [(rc, u["active"], u["pending"]) for rc, u in data["classes"].items()]
        show(data, as_json, f"Project {project}", ("class", "active", "pending"), rows)
        return
    data = client.get("/usages/hosts")
    per_host = [
        (name, u)
        for name, classes in data["hosts"].items()
        for u in [classes.get(resource_class)]
        if u is not None
    ]
    per_host.sort(key=lambda item: -item[1]["used"] / max(item[1]["capacity"], 1))
    if top:
        per_host = per_host[:top]
    host_rows = [
        (
            name,
            u["capacity"],
            u["active"],
            u["pending"],
            u["free"],
            f"{100 * u['used'] / max(u['capacity'], 1):.0f}%",
        )
        for name, u in per_host
    ]
    show(
        data,
        as_json,
        f"{resource_class} per host",
        ("host", "capacity", "active", "pending", "free", "used"),
        host_rows,
    )


@app.command("schedule", cls=RemoteCommand)
def schedule(
    vms: Annotated[list[str] | None, typer.Argument(help="VMs to place (uuid or name)")] = None,
    flavor: Annotated[str | None, typer.Option(help="hypothetical VMs of this flavor")] = None,
    count: Annotated[int | None, typer.Option(help="how many hypothetical VMs")] = None,
    require: Annotated[list[str] | None, typer.Option(help="required trait")] = None,
    forbid: Annotated[list[str] | None, typer.Option(help="forbidden trait")] = None,
    group: Annotated[str | None, typer.Option(help="server group whose rule they obey")] = None,
    dry_run: Annotated[bool, typer.Option(help="decide, claim nothing")] = False,
    gang: Annotated[bool, typer.Option(help="all or none")] = False,
    policy: Annotated[
        str | None, typer.Option(help="scheduling policy (see policies; default the server's)")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(min=0, max=2**63 - 1, help="replay a decision: the seed a run printed"),
    ] = None,
    explain: Annotated[bool, typer.Option(help="show why hosts were ruled out")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Place VMs now (pending claims), or with --dry-run ask where they would go. The
    seed is printed: give it again (--seed) on the same state for the same choices."""
    if not vms and flavor is None:
        fail("name VMs to place or give --flavor", Exit.USAGE)
    spec: dict[str, Any] = {
        "required_traits": require or [],
        "forbidden_traits": forbid or [],
        "group": group,
    }
    client = api()
    names: dict[str, str] = {}
    if vms:
        listed = client.get("/vms")["vms"]
        names = {v["uuid"]: v["name"] for v in listed}
        spec["vms"] = [vm_uuid(v, listed) for v in vms]
    else:
        spec |= {"flavor": flavor, "count": count}
    # One seed for the explanation and the run, so that both decide alike.
    seed = secrets.randbits(63) if seed is None else seed
    params = {"seed": seed} | ({"policy": policy} if policy else {})
    explanation = (
        client.request("POST", "/schedule/explain", body=spec, params=params) if explain else None
    )
    body = {
        "requests": [spec],
        "gang": gang,
        "dry_run": dry_run or not vms,
        "policy": policy,
        "seed": seed,
    }
    result = client.post("/schedule", body)
    if as_json:
        print_json({**result, "explanation": explanation} if explain else result)
    else:
        _print_schedule(result, names)
        if explanation is not None:
            say(
                format_explanation(
                    explanation, told=[f["reason"] for f in result["failure_reasons"]]
                )
            )
    if result["failed"]:
        raise typer.Exit(int(Exit.CONFLICT))


def _print_schedule(result: dict[str, Any], names: Mapping[str, str]) -> None:
    """VMs by name; a failure shared by many VMs (a gang, a group) is said once, counted."""
    rows = [
        (
            names.get(p["vm"], p["vm"]),
            p["host"] or "not placed",
            f"{p['decision_seconds'] * 1000:.2f}",
        )
        for p in result["placements"]
    ]
    mode = "dry run" if result["dry_run"] else "claimed"
    title = (
        f"Placements ({mode}, policy {result['policy']}): "
        f"{result['placed']} placed, {result['failed']} failed"
    )
    show(result, False, title, ("vm", "host", "ms"), rows)
    say(f"seed {result['seed']} (--seed {result['seed']} on the same state replays it)")
    unlisted = result["placed"] + result["failed"] - result["listed"]
    if unlisted > 0:  # a big dry run is summarised by the server
        per_host = ", ".join(f"{h}: {n}" for h, n in result["by_host"].items())
        say(f"{unlisted} more not listed; placed per host: {per_host}")
    for failure in result["failure_reasons"]:
        vms = failure["vms"]
        say(f"{vms} VM{'s' if vms != 1 else ''} not placed: {failure['reason']}")


@app.command("capacity", cls=RemoteCommand)
def capacity(
    flavor: Annotated[str, typer.Argument(help="the flavor to count")],
    group: Annotated[str | None, typer.Option(help="server group whose rule they obey")] = None,
    policy: Annotated[
        str | None, typer.Option(help="scheduling policy (see policies; default the server's)")
    ] = None,
    top: Annotated[int, typer.Option(help="hosts to list (0: all)")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """How many more VMs of FLAVOR fit now, and where: hosts taking the most first, then
    the hosts where none fits, each with what stops it."""
    data = api().get("/capacity", flavor=flavor, group=group, policy=policy)
    rows = [(host, fits, "") for host, fits in data["per_host"].items()]
    rows += [(host, 0, reason) for host, reason in data["limits"].items()]
    title = f"{data['total']} more {flavor} fit on {len(data['per_host'])} hosts"
    show(data, as_json, title, ("host", "fits", "limited by"), rows[:top] if top else rows)


@app.command("policies", cls=RemoteCommand)
def policies(as_json: JsonOpt = False) -> None:
    """The server's scheduling policies (for --policy) and its default."""
    data = api().get("/policies")
    rows = [
        (
            p["name"] + (" (default)" if p["name"] == data["default"] else ""),
            ", ".join(f"{w['name']}x{w['multiplier']}" for w in p["weighers"]),
            p["description"],
        )
        for p in data["policies"]
    ]
    show(data, as_json, "Scheduling policies", ("name", "weighers", "about"), rows)
