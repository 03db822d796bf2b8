"""Commands that talk to a running API: hosts, flavors, VMs, groups, usage, scheduling."""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from loadmaster.cli.app import api, app
from loadmaster.cli.client import Exit, err_console, fail, format_explanation, print_json

console = Console(highlight=False, markup=False)  # names from the server are not markup
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (for scripts)")]

host_app = typer.Typer(help="Hosts (resource providers).", no_args_is_help=True)
flavor_app = typer.Typer(help="Flavors.", no_args_is_help=True)
vm_app = typer.Typer(help="VMs and their lifecycle.", no_args_is_help=True)
group_app = typer.Typer(help="Server groups.", no_args_is_help=True)
app.add_typer(host_app, name="host")
app.add_typer(flavor_app, name="flavor")
app.add_typer(vm_app, name="vm")
app.add_typer(group_app, name="group")


def show(data: Any, as_json: bool, title: str, columns: Iterable[str], rows: Iterable[Any]) -> None:
    """JSON as the server sent it, or a table for people."""
    if as_json:
        print_json(data)
        return
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    console.print(table)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"{what} {item!r}: write KEY=VALUE", Exit.USAGE)
        pairs[key] = value
    return pairs


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        fail(f"{what}: {text!r} is not an integer", Exit.USAGE)


def _number(text: str, what: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            fail(f"{what}: {text!r} is not a number", Exit.USAGE)


def parse_inventory(item: str) -> tuple[str, dict[str, int | float]]:
    """``VCPU=32`` or ``VCPU=32,allocation_ratio=4,reserved=2``."""
    name, sep, rest = item.partition("=")
    if not sep or not name or not rest:
        fail(f"--inventory {item!r}: write CLASS=TOTAL[,field=value...]", Exit.USAGE)
    total, *options = rest.split(",")
    inventory: dict[str, int | float] = {"total": _int(total, f"{name} total")}
    for key, value in _pairs(options, f"--inventory {name}").items():
        inventory[key] = _number(value, f"{name}.{key}")
    return name, inventory


# -- hosts ---------------------------------------------------------------------------
@host_app.command("list")
def host_list(
    state: Annotated[str | None, typer.Option(help="up, maintenance or down")] = None,
    aggregate: Annotated[str | None, typer.Option(help="only hosts in this aggregate")] = None,
    as_json: JsonOpt = False,
) -> None:
    data = api().get("/hosts", state=state, member_of=aggregate)
    rows = [
        (h["name"], h["state"], h["generation"], h["traits"], h["aggregates"], h["uuid"])
        for h in data["hosts"]
    ]
    show(data, as_json, "Hosts", ("name", "state", "gen", "traits", "aggregates", "uuid"), rows)


@host_app.command("show")
def host_show(name: str, as_json: JsonOpt = False) -> None:
    client = api()
    host = client.get(f"/hosts/{name}")
    usages = client.get(f"/resource_providers/{name}/usages")
    inventories = client.get(f"/resource_providers/{name}/inventories")["inventories"]
    agent = client.get(f"/hosts/{name}/agent")
    data = {**host, "inventories": inventories, "usages": usages["classes"], "agent": agent}
    rows = [
        (
            rc,
            inv["total"],
            inv["reserved"],
            inv["allocation_ratio"],
            u.get("capacity"),
            u.get("active"),
            u.get("pending"),
            u.get("free"),
        )
        for rc, inv in inventories.items()
        for u in [usages["classes"].get(rc, {})]
    ]
    seen = f", last heard {agent['last_seen_at']}" if agent["last_seen_at"] else ""
    title = (
        f"{host['name']} ({host['state']}, generation {host['generation']}; "
        f"agent {agent['status']}{seen})"
    )
    show(
        data,
        as_json,
        title,
        ("class", "total", "reserved", "ratio", "capacity", "active", "pending", "free"),
        rows,
    )


@host_app.command("create")
def host_create(
    name: str,
    inventory: Annotated[
        list[str], typer.Option("--inventory", "-i", help="CLASS=TOTAL[,allocation_ratio=4,...]")
    ],
    trait: Annotated[list[str] | None, typer.Option("--trait", "-t")] = None,
    aggregate: Annotated[list[str] | None, typer.Option("--aggregate", "-a")] = None,
    state: str = "up",
    as_json: JsonOpt = False,
) -> None:
    body = {
        "name": name,
        "state": state,
        "inventories": dict(parse_inventory(i) for i in inventory),
        "traits": trait or [],
        "aggregates": aggregate or [],
    }
    host = api().post("/hosts", body)
    show(host, as_json, "Host created", ("name", "uuid"), [(host["name"], host["uuid"])])


@host_app.command("delete")
def host_delete(name: str) -> None:
    api().delete(f"/resource_providers/{name}")
    console.print(f"host {name} deleted")


@host_app.command("state")
def host_state(
    name: str, state: Annotated[str, typer.Argument(help="up, maintenance or down")]
) -> None:
    host = api().put(f"/hosts/{name}", {"state": state})
    console.print(f"host {host['name']} is {host['state']} (generation {host['generation']})")


@host_app.command("drain")
def host_drain(
    name: str,
    force: Annotated[
        bool, typer.Option("--force", help="stop the VMs that fit nowhere else")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="follow the migrations until none is left")
    ] = False,
    timeout: Annotated[float, typer.Option(help="seconds --wait waits at most")] = 600.0,
    interval: Annotated[float, typer.Option(help="seconds between two looks")] = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """Put HOST in maintenance and place every VM on it elsewhere in one batch; the host
    agents carry out the migrations. Draining again places what is left (an aborted
    migration, a VM that did not fit before). Exits 4 if VMs are left on the host: VMs
    that fit nowhere (listed with the scheduler's explanation) or, with --wait, migrations
    still under way at the timeout or aborted."""
    if timeout < 0 or interval <= 0:
        fail("--timeout must be at least 0 and --interval above 0", Exit.USAGE)
    client = api()
    result = client.post(f"/hosts/{name}/drain", {"force": force})
    final = _follow_drain(name, result, timeout, interval, quiet=as_json) if wait else None
    if as_json:
        print_json({**result, "final": final} if wait else result)
    else:
        _print_drain(name, result, final)
    left = (final or result)["vms_left"]
    if left:
        raise typer.Exit(int(Exit.CONFLICT))


def _follow_drain(
    name: str, result: dict[str, Any], timeout: float, interval: float, *, quiet: bool
) -> dict[str, Any]:
    """Poll the host until no migration from or to it is under way (or the timeout); a
    progress bar shows the migrations done. Returns the host's last drain status."""
    client = api()
    status: dict[str, Any] = client.get(f"/hosts/{name}")["drain"]
    total = status["migrating"]
    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn(f"draining {name}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("migrations done"),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet or total == 0,
        transient=False,
    ) as progress:
        task = progress.add_task("drain", total=total)
        while status["migrating"] and time.monotonic() < deadline:
            time.sleep(min(interval, max(deadline - time.monotonic(), 0)))
            status = client.get(f"/hosts/{name}")["drain"]
            progress.update(task, completed=max(total - status["migrating"], 0))
    return status


def _print_drain(name: str, result: dict[str, Any], final: dict[str, Any] | None) -> None:
    moved = result["moved"]
    if moved:
        show(
            result,
            False,
            f"{len(moved)} VMs placed elsewhere",
            ("vm", "destination"),
            sorted(moved.items()),
        )
    for u in result["unplaced"]:
        what = "fits nowhere, stopped (--force)" if u["stopped"] else "fits nowhere"
        why = format_explanation(u["explanation"]) if u["explanation"] else u["reason"]
        console.print(f"VM {u['vm']} {what}: {why}")
    if result["in_flight"]:
        console.print(f"{len(result['in_flight'])} migrations were already under way")
    status = final or result
    console.print(
        f"host {name} is {status['status']}: {status['vms_left']} VMs left, "
        f"{status['migrating']} migrating"
    )


def _replace_set(name: str, kind: str, values: list[str]) -> Any:
    """Read the host's generation, then write the whole set with it; a host changed in
    between answers 409 (exit 4) instead of losing someone else's change."""
    client = api()
    current = client.get(f"/resource_providers/{name}/{kind}")
    return client.put(
        f"/resource_providers/{name}/{kind}",
        {"resource_provider_generation": current["resource_provider_generation"], kind: values},
    )


@host_app.command("set-traits")
def host_set_traits(
    name: str, traits: Annotated[list[str] | None, typer.Argument()] = None
) -> None:
    """Replace the host's traits (none given: clear them)."""
    result = _replace_set(name, "traits", traits or [])
    console.print(f"{name}: traits {_cell(result['traits'])}")


@host_app.command("set-aggregates")
def host_set_aggregates(
    name: str, aggregates: Annotated[list[str] | None, typer.Argument()] = None
) -> None:
    """Replace the host's aggregates (none given: clear them)."""
    result = _replace_set(name, "aggregates", aggregates or [])
    console.print(f"{name}: aggregates {_cell(result['aggregates'])}")


# -- flavors -------------------------------------------------------------------------
@flavor_app.command("list")
def flavor_list(as_json: JsonOpt = False) -> None:
    data = api().get("/flavors")
    rows = [
        (f["name"], f["resources"], f["required_traits"], f["forbidden_traits"])
        for f in data["flavors"]
    ]
    show(data, as_json, "Flavors", ("name", "resources", "requires", "forbids"), rows)


@flavor_app.command("show")
def flavor_show(name: str, as_json: JsonOpt = False) -> None:
    f = api().get(f"/flavors/{name}")
    rows = [(k, _cell(v)) for k, v in f.items()]
    show(f, as_json, f"Flavor {name}", ("field", "value"), rows)


@flavor_app.command("create")
def flavor_create(
    name: str,
    resource: Annotated[list[str], typer.Option("--resource", "-r", help="CLASS=AMOUNT")],
    require: Annotated[list[str] | None, typer.Option(help="required trait")] = None,
    forbid: Annotated[list[str] | None, typer.Option(help="forbidden trait")] = None,
    extra_spec: Annotated[list[str] | None, typer.Option(help="Nova-style KEY=VALUE")] = None,
    as_json: JsonOpt = False,
) -> None:
    body = {
        "name": name,
        "resources": {k: _int(v, k) for k, v in _pairs(resource, "--resource").items()},
        "required_traits": require or [],
        "forbidden_traits": forbid or [],
        "extra_specs": _pairs(extra_spec or [], "--extra-spec"),
    }
    f = api().post("/flavors", body)
    show(f, as_json, "Flavor created", ("name", "resources"), [(f["name"], f["resources"])])


@flavor_app.command("delete")
def flavor_delete(name: str) -> None:
    api().delete(f"/flavors/{name}")
    console.print(f"flavor {name} deleted")


# -- VMs -----------------------------------------------------------------------------
VM_COLUMNS = ("name", "state", "host", "flavor", "group", "uuid")


def _vm_row(v: Mapping[str, Any]) -> tuple[Any, ...]:
    host = v["host"] if not v.get("target_host") else f"{v['host']} -> {v['target_host']}"
    return (v["name"], v["state"], host, v["flavor"], v["group"], v["uuid"])


def vm_uuid(ident: str) -> str:
    """A VM's uuid from its uuid or its (unique) name."""
    try:
        return str(uuidlib.UUID(ident))
    except ValueError:
        pass
    matches = [v["uuid"] for v in api().get("/vms")["vms"] if v["name"] == ident]
    if not matches:
        fail(f"no VM is named {ident!r}", Exit.NOT_FOUND)
    if len(matches) > 1:
        fail(f"{len(matches)} VMs are named {ident!r}; give the uuid", Exit.USAGE)
    return matches[0]


@vm_app.command("list")
def vm_list(
    state: str | None = None,
    host: str | None = None,
    project: str | None = None,
    group: str | None = None,
    as_json: JsonOpt = False,
) -> None:
    data = api().get("/vms", state=state, host=host, project_id=project, group=group)
    show(data, as_json, "VMs", VM_COLUMNS, [_vm_row(v) for v in data["vms"]])


@vm_app.command("show")
def vm_show(vm: str, as_json: JsonOpt = False) -> None:
    client = api()
    uuid = vm_uuid(vm)
    data = {**client.get(f"/vms/{uuid}"), "allocations": client.get(f"/allocations/{uuid}")}
    rows = [
        (alloc["name"], state, amounts)
        for alloc in data["allocations"]["allocations"].values()
        for state in ("active", "pending")
        for amounts in [alloc[state]]
        if amounts
    ]
    title = f"VM {data['name']} ({data['state']}, host {data['host'] or '-'}) {uuid}"
    if data.get("fault"):
        title += f"\nlast fault: {data['fault']}"
    show(data, as_json, title, ("host", "state", "resources"), rows)


@vm_app.command("create")
def vm_create(
    name: str,
    flavor: Annotated[str, typer.Option("--flavor", "-f")],
    group: str | None = None,
    tag: Annotated[list[str] | None, typer.Option("--tag")] = None,
    project: str = "default",
    user: str = "default",
    start: Annotated[bool, typer.Option(help="schedule it right away")] = False,
    as_json: JsonOpt = False,
) -> None:
    client = api()
    body: dict[str, Any] = {"name": name, "flavor": flavor, "project_id": project}
    body |= {"user_id": user, "tags": tag or [], "group": group}
    vm = client.post("/vms", body)
    if start:
        vm = client.post(f"/vms/{vm['uuid']}/start")["vm"]
    show(vm, as_json, "VM created", VM_COLUMNS, [_vm_row(vm)])


def _lifecycle(vm: str, action: str, body: dict[str, Any] | None, as_json: bool) -> None:
    answer = api().post(f"/vms/{vm_uuid(vm)}/{action}", body)
    record = answer.get("vm", answer)
    show(answer, as_json, f"VM {action}", VM_COLUMNS, [_vm_row(record)])


@vm_app.command("start")
def vm_start(vm: str, policy: str | None = None, as_json: JsonOpt = False) -> None:
    """Schedule and claim: the VM is pending on its host until it is reported up."""
    _lifecycle(vm, "start", {"policy": policy}, as_json)


@vm_app.command("up")
def vm_up(vm: str, as_json: JsonOpt = False) -> None:
    """The VM is running: its pending resources become active."""
    _lifecycle(vm, "up", None, as_json)


@vm_app.command("stop")
def vm_stop(vm: str, as_json: JsonOpt = False) -> None:
    _lifecycle(vm, "stop", None, as_json)


@vm_app.command("migrate")
def vm_migrate(
    vm: str,
    host: Annotated[
        str | None, typer.Option(help="destination (default: the scheduler's choice)")
    ] = None,
    reason: str | None = None,
    as_json: JsonOpt = False,
) -> None:
    _lifecycle(vm, "migrate", {"host": host, "reason": reason}, as_json)


@vm_app.command("tag")
def vm_tag(
    vm: str,
    tags: Annotated[list[str], typer.Argument(help="the VM's new tags, e.g. gold priority:2")],
    as_json: JsonOpt = False,
) -> None:
    """Replace a VM's tags; its host's agent applies them (SLA tier) within a cycle."""
    data = api().put(f"/vms/{vm_uuid(vm)}/tags", {"tags": tags})
    show(data, as_json, f"VM {data['name']}", ("tags",), [(" ".join(data["tags"]),)])


@vm_app.command("delete")
def vm_delete(vm: str) -> None:
    uuid = vm_uuid(vm)
    api().delete(f"/vms/{uuid}")
    console.print(f"VM {uuid} deleted")


# -- server groups -------------------------------------------------------------------
@group_app.command("list")
def group_list(as_json: JsonOpt = False) -> None:
    data = api().get("/server_groups")
    rows = [(g["name"], g["policy"], g["max_per_host"], g["uuid"]) for g in data["server_groups"]]
    show(data, as_json, "Server groups", ("name", "policy", "max/host", "uuid"), rows)


@group_app.command("show")
def group_show(group: str, as_json: JsonOpt = False) -> None:
    g = api().get(f"/server_groups/{group}")
    rows = [(member,) for member in g["members"]]
    show(g, as_json, f"Group {g['name']} ({g['policy']}): {len(rows)} members", ("vm",), rows)


@group_app.command("create")
def group_create(
    name: str,
    policy: Annotated[
        str, typer.Option(help="affinity, anti-affinity, soft-affinity or soft-anti-affinity")
    ],
    max_per_host: int | None = None,
    as_json: JsonOpt = False,
) -> None:
    g = api().post("/server_groups", {"name": name, "policy": policy, "max_per_host": max_per_host})
    show(
        g,
        as_json,
        "Server group created",
        ("name", "policy", "uuid"),
        [(g["name"], g["policy"], g["uuid"])],
    )


@group_app.command("delete")
def group_delete(group: str) -> None:
    api().delete(f"/server_groups/{group}")
    console.print(f"server group {group} deleted")


# -- usage, scheduling ---------------------------------------------------------------
@app.command("usage")
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


@app.command("schedule")
def schedule(
    vms: Annotated[list[str] | None, typer.Argument(help="VMs to place (uuid or name)")] = None,
    flavor: Annotated[str | None, typer.Option(help="hypothetical VMs of this flavor")] = None,
    count: int | None = None,
    require: Annotated[list[str] | None, typer.Option(help="required trait")] = None,
    forbid: Annotated[list[str] | None, typer.Option(help="forbidden trait")] = None,
    group: str | None = None,
    dry_run: Annotated[bool, typer.Option(help="decide, claim nothing")] = False,
    gang: Annotated[bool, typer.Option(help="all or none")] = False,
    policy: str | None = None,
    explain: Annotated[bool, typer.Option(help="show why hosts were ruled out")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Place VMs now (pending claims), or with --dry-run ask where they would go."""
    if not vms and flavor is None:
        fail("name VMs to place or give --flavor", Exit.USAGE)
    spec: dict[str, Any] = {
        "required_traits": require or [],
        "forbidden_traits": forbid or [],
        "group": group,
    }
    if vms:
        spec["vms"] = [vm_uuid(v) for v in vms]
    else:
        spec |= {"flavor": flavor, "count": count}
    client = api()
    body = {"requests": [spec], "gang": gang, "dry_run": dry_run or not vms, "policy": policy}
    result = client.post("/schedule", body)
    explanation = client.post("/schedule/explain", spec) if explain else None
    if as_json:
        print_json({**result, "explanation": explanation} if explain else result)
    else:
        rows = [
            (
                p["vm"],
                p["host"],
                (p["error"] or {}).get("detail"),
                f"{p['decision_seconds'] * 1000:.2f}",
            )
            for p in result["placements"]
        ]
        mode = "dry run" if result["dry_run"] else "claimed"
        title = (
            f"Placements ({mode}, policy {result['policy']}): {result['placed']} placed, "
            f"{result['failed']} failed"
        )
        show(result, False, title, ("vm", "host", "error", "ms"), rows)
        unlisted = result["placed"] + result["failed"] - result.get("listed", len(rows))
        if unlisted > 0:  # a big dry run is summarised by the server
            per_host = ", ".join(f"{h}: {n}" for h, n in result.get("by_host", {}).items())
            console.print(f"{unlisted} more not listed; placed per host: {per_host}")
        if explanation is not None:
            console.print(format_explanation(explanation))
    if result["failed"]:
        raise typer.Exit(int(Exit.CONFLICT))


@app.command("capacity")
def capacity(
    flavor: str,
    group: str | None = None,
    policy: str | None = None,
    top: Annotated[int, typer.Option(help="hosts to list (0: all)")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """How many more VMs of FLAVOR fit now, and where."""
    data = api().get("/capacity", flavor=flavor, group=group, policy=policy)
    per_host = list(data["per_host"].items())
    rows = per_host[:top] if top else per_host
    title = f"{data['total']} more {flavor} fit on {len(per_host)} hosts"
    show(data, as_json, title, ("host", "fits"), rows)
