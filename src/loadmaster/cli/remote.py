"""Commands that talk to a running API: hosts, resource classes, traits, flavors, VMs,
groups, usage, scheduling, the audit. rich loads only when a table is printed."""

from __future__ import annotations

import secrets
import time
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loadmaster.cli.app import RemoteCommand, RemoteGroup, api, app
from loadmaster.cli.client import Exit, err_console, fail, format_explanation, print_json

if TYPE_CHECKING:
    from rich.console import Console

JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (for scripts)")]
VmArg = Annotated[str, typer.Argument(help="the VM's uuid or (unique) name")]
HostArg = Annotated[str, typer.Argument(help="the host's name or uuid")]
GroupArg = Annotated[str, typer.Argument(help="the server group's name or uuid")]


def _group(help_text: str) -> typer.Typer:
    return typer.Typer(help=help_text, no_args_is_help=True, cls=RemoteGroup)


host_app = _group("Hosts (resource providers) and their child providers (NUMA cells).")
class_app = _group("Resource classes (standard and CUSTOM_*).")
trait_app = _group("Traits hosts carry and flavors require or forbid.")
flavor_app = _group("Flavors.")
vm_app = _group("VMs and their lifecycle.")
group_app = _group("Server groups.")
app.add_typer(host_app, name="host")
app.add_typer(class_app, name="class")
app.add_typer(trait_app, name="trait")
app.add_typer(flavor_app, name="flavor")
app.add_typer(vm_app, name="vm")
app.add_typer(group_app, name="group")


@cache
def console() -> Console:
    from rich.console import Console

    return Console(highlight=False, markup=False)  # names from the server are not markup


def show(data: Any, as_json: bool, title: str, columns: Iterable[str], rows: Iterable[Any]) -> None:
    """JSON as the server sent it, or a table for people. A table wider than the terminal
    is printed wide rather than cut: a class or VM name must be read whole."""
    if as_json:
        print_json(data)
        return
    from rich.measure import Measurement
    from rich.table import Table

    table = Table()
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    from rich.console import Console

    out = Console(highlight=False, markup=False)
    out.width = max(
        out.width, Measurement.get(out, out.options.update_width(10_000), table).maximum
    )
    # The title on a line of its own: as the table's title it would wrap at its width.
    out.print(title, soft_wrap=True)
    out.print(table)


def say(text: str) -> None:
    console().print(text, soft_wrap=True)


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
    """Hosts and child providers; a child names its parent."""
    data = api().get("/hosts", state=state, member_of=aggregate)
    providers = data["hosts"]
    names = {h["uuid"]: h["name"] for h in providers}
    rows = [
        (
            h["name"],
            names.get(h["parent_provider_uuid"], h["parent_provider_uuid"]),
            h["state"],
            h["generation"],
            h["traits"],
            h["aggregates"],
            h["uuid"],
        )
        for h in providers
    ]
    columns = ("name", "parent", "state", "gen", "traits", "aggregates", "uuid")
    show(data, as_json, "Hosts", columns, rows)


@host_app.command("tree")
def host_tree(as_json: JsonOpt = False) -> None:
    """Hosts with their child providers (NUMA cells) beneath them."""
    data = api().get("/hosts")
    if as_json:
        print_json(data)
        return
    children: dict[str | None, list[dict[str, Any]]] = {}
    for h in data["hosts"]:
        children.setdefault(h["parent_provider_uuid"], []).append(h)

    def lines(parent: str | None, depth: int) -> Iterable[str]:
        for h in children.get(parent, []):
            yield f"{'  ' * depth}{h['name']} ({h['state']})"
            yield from lines(h["uuid"], depth + 1)

    for line in lines(None, 0):
        say(line)


@host_app.command("show")
def host_show(name: HostArg, as_json: JsonOpt = False) -> None:
    """Inventories, usage per class (pending counted as used) and its agent's status."""
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
    name: Annotated[str, typer.Argument(help="the new host's (unique) name")],
    inventory: Annotated[
        list[str],
        typer.Option(
            "--inventory",
            "-i",
            help="CLASS=TOTAL[,allocation_ratio=4,reserved=2,min_unit=,max_unit=,step_size=]",
        ),
    ],
    trait: Annotated[list[str] | None, typer.Option("--trait", "-t", help="a trait it has")] = None,
    aggregate: Annotated[
        list[str] | None, typer.Option("--aggregate", "-a", help="an aggregate it belongs to")
    ] = None,
    parent: Annotated[
        str | None,
        typer.Option(help="make it a child provider (a NUMA cell) of this host"),
    ] = None,
    state: Annotated[str, typer.Option(help="up, maintenance or down")] = "up",
    as_json: JsonOpt = False,
) -> None:
    """Register a host (or, with --parent, a child provider) by hand."""
    body = {
        "name": name,
        "state": state,
        "inventories": dict(parse_inventory(i) for i in inventory),
        "traits": trait or [],
        "aggregates": aggregate or [],
    }
    if parent is not None:
        body["parent_provider_uuid"] = api().get(f"/resource_providers/{parent}")["uuid"]
    host = api().post("/hosts", body)
    show(host, as_json, "Host created", ("name", "uuid"), [(host["name"], host["uuid"])])


@host_app.command("delete")
def host_delete(name: HostArg) -> None:
    """Delete a host that holds nothing (no claims, no child providers)."""
    api().delete(f"/resource_providers/{name}")
    say(f"host {name} deleted")


@host_app.command("set-inventory")
def host_set_inventory(
    name: HostArg,
    inventory: Annotated[
        str,
        typer.Argument(
            help="CLASS=TOTAL[,allocation_ratio=4,reserved=2,...]: the class's whole new "
            "inventory (fields left out take their defaults)"
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Set one class's inventory on a host. Sent with the generation just read: a host
    changed in between exits 4 instead of losing the other change; shrinking below what
    is allocated is refused."""
    resource_class, fields = parse_inventory(inventory)
    client = api()
    generation = client.get(f"/resource_providers/{name}")["generation"]
    body = {**fields, "resource_provider_generation": generation}
    inv = client.put(f"/resource_providers/{name}/inventories/{resource_class}", body)
    # Placement's answer has no capacity; it is what the ledger counts against.
    capacity = int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
    rows = [(resource_class, inv["total"], inv["allocation_ratio"], capacity)]
    columns = ("class", "total", "ratio", "capacity")
    show(inv, as_json, f"{name}: inventory set", columns, rows)


@host_app.command("remove-inventory")
def host_remove_inventory(
    name: HostArg,
    resource_class: Annotated[str, typer.Argument(help="the class to remove from the host")],
) -> None:
    """Remove one class from a host (refused while anything is allocated from it)."""
    client = api()
    generation = client.get(f"/resource_providers/{name}")["generation"]
    client.delete(
        f"/resource_providers/{name}/inventories/{resource_class}",
        resource_provider_generation=generation,
    )
    say(f"{name}: {resource_class} removed")


@host_app.command("report")
def host_report(name: HostArg, as_json: JsonOpt = False) -> None:
    """What the host's agent last said: its status (ok, silent, none), hypervisor and
    when it was last heard from, with the VMs on the host or coming to it."""
    client = api()
    agent = client.get(f"/hosts/{name}/agent")
    vms = client.get("/vms", host=name, incoming=True)["vms"]
    data = {"agent": agent, "vms": vms}
    seen = agent["last_seen_at"] or "never"
    title = (
        f"{name}: agent {agent['status']} ({agent['hypervisor_uri'] or 'no hypervisor'}), "
        f"last heard {seen}; {len(vms)} VMs"
    )
    show(data, as_json, title, VM_COLUMNS, [_vm_row(v) for v in vms])


@host_app.command("state")
def host_state(
    name: HostArg, state: Annotated[str, typer.Argument(help="up, maintenance or down")]
) -> None:
    """Set a host's state: only up hosts take new VMs."""
    host = api().put(f"/hosts/{name}", {"state": state})
    say(f"host {host['name']} is {host['state']} (generation {host['generation']})")


@host_app.command("drain")
def host_drain(
    name: HostArg,
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
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

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
        console=err_console(),
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
    moved, names = result["moved"], result.get("names", {})
    if moved:
        show(
            result,
            False,
            f"{len(moved)} VMs placed elsewhere",
            ("vm", "destination"),
            sorted((names.get(vm, vm), host) for vm, host in moved.items()),
        )
    for u in result["unplaced"]:
        what = "fits nowhere, stopped (--force)" if u["stopped"] else "fits nowhere"
        why = format_explanation(u["explanation"]) if u["explanation"] else u["reason"]
        say(f"VM {names.get(u['vm'], u['vm'])} {what}: {why}")
    if result["in_flight"]:
        say(f"{len(result['in_flight'])} migrations were already under way")
    status = final or result
    say(
        f"host {name} is {status['status']}: {status['vms_left']} VMs left, "
        f"{status['migrating']} migrating"
    )


def _replace_set(name: str, kind: str, values: list[str]) -> Any:
    """Read the host's generation, then write the whole set with it; a host changed in
    between answers 409 (exit 4) instead of losing someone else's change."""
    client = api()
    current = client.get(f"/hosts/{name}")
    return client.put(
        f"/hosts/{name}/{kind}",
        {"resource_provider_generation": current["generation"], kind: values},
    )


@host_app.command("set-traits")
def host_set_traits(
    name: HostArg,
    traits: Annotated[list[str] | None, typer.Argument(help="the host's new traits")] = None,
) -> None:
    """Replace the host's traits (none given: clear them)."""
    result = _replace_set(name, "traits", traits or [])
    say(f"{name}: traits {_cell(result['traits'])}")


@host_app.command("set-aggregates")
def host_set_aggregates(
    name: HostArg,
    aggregates: Annotated[
        list[str] | None, typer.Argument(help="the host's new aggregates")
    ] = None,
) -> None:
    """Replace the host's aggregates (none given: clear them)."""
    result = _replace_set(name, "aggregates", aggregates or [])
    say(f"{name}: aggregates {_cell(result['aggregates'])}")


# -- resource classes and traits -----------------------------------------------------
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
def trait_list(as_json: JsonOpt = False) -> None:
    """Every trait."""
    data = api().get("/traits")
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


# -- flavors -------------------------------------------------------------------------
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
    rows = [(k, _cell(v)) for k, v in f.items()]
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
        "resources": {k: _int(v, k) for k, v in _pairs(resource or [], "--resource").items()},
        "required_traits": require or [],
        "forbidden_traits": forbid or [],
        "extra_specs": _pairs(extra_spec or [], "--extra-spec"),
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


# -- VMs -----------------------------------------------------------------------------
VM_COLUMNS = ("name", "state", "host", "flavor", "group", "tags", "uuid")


def _vm_row(v: Mapping[str, Any]) -> tuple[Any, ...]:
    host = v["host"] if not v.get("target_host") else f"{v['host']} -> {v['target_host']}"
    return (v["name"], v["state"], host, v["flavor"], v["group"], v["tags"], v["uuid"])


def vm_uuid(ident: str, vms: list[dict[str, Any]] | None = None) -> str:
    """A VM's uuid from its uuid or its (unique) name, looked up by the server; ``vms``
    is the VM list when the caller has it already (many names, one request)."""
    try:
        return str(uuidlib.UUID(ident))
    except ValueError:
        pass
    listed = api().get("/vms", name=ident, limit=2)["vms"] if vms is None else vms
    matches = [v["uuid"] for v in listed if v["name"] == ident]
    if not matches:
        fail(f"no VM is named {ident!r}", Exit.NOT_FOUND)
    if len(matches) > 1:
        fail(f"{len(matches)} VMs are named {ident!r}; give the uuid", Exit.USAGE)
    return matches[0]


@vm_app.command("list")
def vm_list(
    state: Annotated[str | None, typer.Option(help="only VMs in this state")] = None,
    host: Annotated[
        str | None, typer.Option(help="only VMs on this host or migrating to it")
    ] = None,
    project: Annotated[str | None, typer.Option(help="only this project's VMs")] = None,
    group: Annotated[str | None, typer.Option(help="only this server group's VMs")] = None,
    tag: Annotated[str | None, typer.Option(help="only VMs with this tag")] = None,
    name: Annotated[str | None, typer.Option(help="only VMs of this name")] = None,
    limit: Annotated[int | None, typer.Option(min=0, help="at most this many")] = None,
    offset: Annotated[int, typer.Option(min=0, help="skip this many first (oldest first)")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """VMs, oldest first; the server filters and pages. A migrating VM shows
    SOURCE -> DESTINATION."""
    data = api().get(
        "/vms",
        state=state,
        host=host,
        incoming=host is not None or None,
        project_id=project,
        group=group,
        tag=tag,
        name=name,
        limit=limit,
        offset=offset or None,
    )
    show(data, as_json, "VMs", VM_COLUMNS, [_vm_row(v) for v in data["vms"]])


@vm_app.command("show")
def vm_show(vm: VmArg, as_json: JsonOpt = False) -> None:
    """A VM, its last fault and what it holds on which host (active, pending)."""
    client = api()
    uuid = vm_uuid(vm)
    data = {**client.get(f"/vms/{uuid}"), "allocations": client.get(f"/vms/{uuid}/allocations")}
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
    name: Annotated[str, typer.Argument(help="the new VM's name")],
    flavor: Annotated[str, typer.Option("--flavor", "-f", help="its flavor")],
    group: Annotated[str | None, typer.Option(help="server group it joins")] = None,
    tag: Annotated[
        list[str] | None, typer.Option("--tag", help="a tag, e.g. gold or priority:2")
    ] = None,
    project: Annotated[str, typer.Option(help="project it is counted against")] = "default",
    user: Annotated[str, typer.Option(help="user who owns it")] = "default",
    start: Annotated[bool, typer.Option(help="schedule it right away")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Create a VM (requested: it holds nothing until started)."""
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
def vm_start(
    vm: VmArg,
    policy: Annotated[str | None, typer.Option(help="scheduling policy (see policies)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Schedule and claim: the VM is pending on its host until it is reported up."""
    _lifecycle(vm, "start", {"policy": policy}, as_json)


@vm_app.command("up")
def vm_up(vm: VmArg, as_json: JsonOpt = False) -> None:
    """The VM is running: its pending resources become active."""
    _lifecycle(vm, "up", None, as_json)


@vm_app.command("stop")
def vm_stop(vm: VmArg, as_json: JsonOpt = False) -> None:
    """Stop a VM: what it holds is released."""
    _lifecycle(vm, "stop", None, as_json)


@vm_app.command("migrate")
def vm_migrate(
    vm: VmArg,
    host: Annotated[
        str | None, typer.Option(help="destination (default: the scheduler's choice)")
    ] = None,
    reason: Annotated[str | None, typer.Option(help="why, for the server's log")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Claim a destination for a running VM; the source host's agent moves it."""
    _lifecycle(vm, "migrate", {"host": host, "reason": reason}, as_json)


@vm_app.command("abort-migration")
def vm_abort_migration(vm: VmArg, as_json: JsonOpt = False) -> None:
    """Give up a migration: the destination's claim is released and the VM stays where
    it runs. A VM not migrating is left as it is."""
    client = api()
    uuid = vm_uuid(vm)
    target = client.get(f"/vms/{uuid}")["target_host"]
    if target is None:
        fail(f"VM {vm} is not migrating", Exit.CONFLICT)
    client.delete(f"/vms/{uuid}/allocations", host=target)
    record = client.get(f"/vms/{uuid}")
    show(record, as_json, f"migration to {target} aborted", VM_COLUMNS, [_vm_row(record)])


@vm_app.command("tag")
def vm_tag(
    vm: VmArg,
    tags: Annotated[list[str], typer.Argument(help="the VM's new tags, e.g. gold priority:2")],
    as_json: JsonOpt = False,
) -> None:
    """Replace a VM's tags; its host's agent applies them (SLA tier) within a cycle."""
    data = api().put(f"/vms/{vm_uuid(vm)}/tags", {"tags": tags})
    show(data, as_json, f"VM {data['name']}", ("tags",), [(" ".join(data["tags"]),)])


@vm_app.command("delete")
def vm_delete(vm: VmArg) -> None:
    """Delete a VM and release what it holds (deleting again is harmless)."""
    uuid = vm_uuid(vm)
    api().delete(f"/vms/{uuid}")
    say(f"VM {uuid} deleted")


# -- server groups -------------------------------------------------------------------
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
    rows = [_vm_row(v) for v in members]
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


# -- usage, scheduling ---------------------------------------------------------------
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
            say(format_explanation(explanation))
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
    rows = [(host, fits, "-") for host, fits in data["per_host"].items()]
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
