"""``loadmaster host ...``: hosts (resource providers), their inventories, traits,
aggregates and state, draining one, and evacuating one that is down."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from loadmaster.cli.app import api, remote_group
from loadmaster.cli.client import Exit, err_console, fail, format_explanation, print_json
from loadmaster.cli.output import (
    VM_COLUMNS,
    HostArg,
    JsonOpt,
    cell,
    parse_inventory,
    say,
    show,
    vm_row,
    warn,
)

# Seconds --wait may go without printing a line.
PROGRESS_EVERY = 10.0

host_app = remote_group(
    "host", "Hosts (resource providers) and their child providers (NUMA cells)."
)


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
    """Inventories and usage per class (pending counted as used) of the host and of each
    child provider beneath it (its NUMA cells, where an agent puts CPUs and memory), and
    its agent's status, and its devices with the VMs holding them."""
    client = api()
    host = client.get(f"/hosts/{name}")
    agent = client.get(f"/hosts/{host['name']}/agent")
    tree = client.get("/hosts", in_tree=host["uuid"])["hosts"]
    devices = client.get(f"/hosts/{host['name']}/devices")["devices"]
    # The host first, then its children beneath their parents, as ``host tree`` draws them.
    under: dict[str | None, list[dict[str, Any]]] = {}
    for provider in tree:
        under.setdefault(provider["parent_provider_uuid"], []).append(provider)

    def beneath(uuid: str, depth: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for child in under.get(uuid, []):
            yield depth, child
            yield from beneath(child["uuid"], depth + 1)

    providers = [(0, host), *beneath(host["uuid"], 1)]
    shown = []
    for _depth, provider in providers:
        shown.append(
            {
                "name": provider["name"],
                "inventories": client.get(f"/resource_providers/{provider['uuid']}/inventories")[
                    "inventories"
                ],
                "usages": client.get(f"/hosts/{provider['uuid']}/usages")["classes"],
            }
        )
    data = {
        **host,
        "inventories": shown[0]["inventories"],
        "usages": shown[0]["usages"],
        "children": shown[1:],
        "agent": agent,
        "devices": devices,
    }
    rows = [
        (
            "  " * depth + p["name"],
            rc,
            inv["total"],
            inv["reserved"],
            inv["allocation_ratio"],
            u.get("capacity"),
            u.get("active"),
            u.get("pending"),
            u.get("free"),
        )
        for (depth, _), p in zip(providers, shown, strict=True)
        for rc, inv in p["inventories"].items()
        for u in [p["usages"].get(rc, {})]
    ]
    seen = f", last heard {agent['last_seen_at']}" if agent["last_seen_at"] else ""
    title = (
        f"{host['name']} ({host['state']}, generation {host['generation']}; "
        f"agent {agent['status']}{seen})"
    )
    columns = ("provider", "class", "total", "reserved", "ratio", "capacity", "active")
    show(data, as_json, title, (*columns, "pending", "free"), rows)
    if devices and not as_json:
        show(
            data,
            False,
            "Devices",
            ("provider", "on", "class", "used", "total", "traits", "held by"),
            [
                (
                    d["provider"],
                    d["parent"],
                    d["resource_class"],
                    d["used"],
                    d["total"],
                    ",".join(d["traits"]) or "-",
                    "; ".join(_holder(h) for h in d["holders"]) or "-",
                )
                for d in devices
            ],
        )
    if not as_json and host["drain"] is not None:
        warn(host["drain"]["warnings"])


def _holder(holder: dict[str, Any]) -> str:
    """A VM holding devices of a provider: its name, and the addresses its agent gave it."""
    given = ",".join(d["address"] for d in holder["devices"])
    pending = " pending" if holder["state"] == "pending" else ""
    return f"{holder['name']}{pending} ({given or holder['amount']})"


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
        body["parent_provider_uuid"] = api().get(f"/hosts/{parent}")["uuid"]
    host = api().post("/hosts", body)
    show(host, as_json, "Host created", ("name", "uuid"), [(host["name"], host["uuid"])])


@host_app.command("import")
def host_import(
    path: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            help="a JSON file: a list of hosts as POST /hosts takes them (name, inventories, "
            'traits, aggregates, state, uuid), or {"hosts": [...]}',
        ),
    ],
    chunk: Annotated[int, typer.Option(min=1, max=10_000, help="hosts per request")] = 1000,
) -> None:
    """Register many root hosts from a file, CHUNK hosts a request (POST /bulk/hosts).
    Each request is all or none; a refusal stops the import and says which of the file's
    hosts its request held and how many were registered before it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        fail(f"PATH: {path}: not JSON: {exc}", Exit.USAGE)
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or not hosts:
        fail(f'PATH: {path}: expected a list of hosts or {{"hosts": [...]}}', Exit.USAGE)
    client = api()
    done = 0
    with _progress(len(hosts)) as advance:
        for first in range(0, len(hosts), chunk):
            batch = hosts[first : first + chunk]
            try:
                client.post("/bulk/hosts", {"hosts": batch})
            except typer.Exit:
                err_console().print(
                    f"this request held the file's hosts {first}..{first + len(batch) - 1} "
                    f"(hosts[i] above is the file's {first} + i); {done} registered before it",
                    markup=False,
                )
                raise
            done += len(batch)
            advance(len(batch))
    say(f"registered {done} hosts")


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for an import of more than one request's worth."""
    from rich.progress import Progress

    with Progress(console=err_console(), transient=True, disable=total <= 1000) as progress:
        task = progress.add_task("registering hosts", total=total)
        yield lambda n: progress.advance(task, n)


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
    resource_class, fields = parse_inventory(inventory, "INVENTORY")
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
    if agent.get("fence_failures"):
        title += (
            f"\nfencing failed {agent['fence_failures']} time(s) in a row: {agent['fence_error']}"
        )
    show(data, as_json, title, VM_COLUMNS, [vm_row(v) for v in vms])


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
    still under way at the timeout, or that failed (each named with its reason)."""
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
    if left or (final or {}).get("failed"):
        raise typer.Exit(int(Exit.CONFLICT))


def _follow_drain(
    name: str, result: dict[str, Any], timeout: float, interval: float, *, quiet: bool
) -> dict[str, Any]:
    """Poll the host until no migration from or to it is under way (or the timeout),
    printing a line to stderr whenever the counts change and at least every
    ``PROGRESS_EVERY`` seconds, with the host's warnings (a silent agent) when they
    change: a wait never looks like a hang. A migration is done only once its VM runs on
    its destination; one that ended otherwise (rolled back, the VM stopped) is failed.
    Returns the host's last drain status, with ``failed``: each failed move's VM as the
    server has it (state, host, fault)."""
    client = api()
    moves = _Moves(result)
    status: dict[str, Any] = client.get(f"/hosts/{name}")["drain"]
    started = time.monotonic()
    deadline = started + timeout
    said: tuple[tuple[int, int, int, int], tuple[str, ...]] | None = None
    last_line = started
    while True:
        counts = (*moves.counts(status), moves.total)
        warnings = tuple(status["warnings"])
        now = time.monotonic()
        if not quiet and (said != (counts, warnings) or now - last_line >= PROGRESS_EVERY):
            if said is None or said[1] != warnings:
                warn(warnings)
            done, failed, under_way, total = counts
            err_console().print(
                f"draining {name}: {done} of {total} migrations done, "
                f"{under_way} under way, {failed} failed, {now - started:.0f} s",
                markup=False,
            )
            said, last_line = (counts, warnings), now
        if not status["migrating"] or now >= deadline:
            return {**status, "failed": list(moves.failed.values())}
        time.sleep(min(interval, max(deadline - now, 0)))
        status = client.get(f"/hosts/{name}")["drain"]


class _Moves:
    """The migrations a drain follows (those it claimed, and those already under way) and
    how each ended, as the server says: done once the VM runs on its destination. A VM
    the drain placed again before it ever ran is no migration: its launch is left out."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.destination: dict[str, str | None] = dict(result["moved"])
        headed = {v["vm"]: v["target_host"] for v in result["vms"]}
        for vm in result["in_flight"]:
            # Headed to this host, or away from it to wherever it was claimed.
            self.destination.setdefault(vm, headed.get(vm))
        self.seen_migrating: set[str] = set()
        self.done: set[str] = set()
        self.failed: dict[str, dict[str, Any]] = {}

    @property
    def total(self) -> int:
        return len(self.destination)

    def counts(self, status: dict[str, Any]) -> tuple[int, int, int]:
        """(done, failed, under way) as of ``status``."""
        migrating = {v["vm"] for v in status["vms"] if v["state"] == "migrating"}
        under_way = 0
        for vm, destination in list(self.destination.items()):
            if vm in self.done or vm in self.failed:
                continue
            if vm in migrating:
                self.seen_migrating.add(vm)
                under_way += 1
                continue
            record = api().get(f"/vms/{vm}")
            if record["state"] == "running" and record["host"] == destination:
                self.done.add(vm)
            elif record["state"] == "pending" and vm not in self.seen_migrating:
                del self.destination[vm]  # placed again before it ran: a launch
            else:
                self.failed[vm] = {
                    k: record.get(k) for k in ("uuid", "name", "state", "host", "fault")
                }
        return len(self.done), len(self.failed), under_way


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
    for vm in (final or {}).get("failed", ()):
        where = f"{vm['state']} on {vm['host']}" if vm["host"] else vm["state"]
        say(f"VM {vm['name']} did not move ({where}): {vm['fault'] or 'no reason recorded'}")
    status = final or result
    if final is None:  # --wait printed them as they came
        warn(status["warnings"])
    say(
        f"host {name} is {status['status']}: {status['vms_left']} VMs left, "
        f"{status['migrating']} migrating"
    )


@host_app.command("evacuate")
def host_evacuate(
    name: HostArg,
    confirm_down: Annotated[
        bool,
        typer.Option(
            "--confirm-down",
            help="you made sure HOST is off (powered down, its VMs dead): its claims end",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="with --confirm-down: at once, even if HOST's agent was heard within the "
            "silence threshold",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Start the VMs of a dead HOST on other hosts, highly available ones (tag ha) first.
    HOST must be known down: confirmed with --confirm-down, fenced by the server's fence
    command, or already down; otherwise nothing changes (exit 4). While its agent was
    heard within the silence threshold, --confirm-down also needs --force. The host then
    stays down until you set it up again (host state HOST up). Evacuating again places
    what is left; migrations from or to HOST are taken over. Exits 4 if VMs fit nowhere
    (they keep their claim on HOST)."""
    result = api().post(f"/hosts/{name}/evacuate", {"confirm_down": confirm_down, "force": force})
    if as_json:
        print_json(result)
    else:
        _print_evacuation(result)
    if result["unplaced"]:
        raise typer.Exit(int(Exit.CONFLICT))


def _print_evacuation(result: dict[str, Any]) -> None:
    how = {
        "fenced": "fenced by the fence command",
        "confirmed": "confirmed down by you",
        "already": "already down",
    }[result["known_down"]]
    say(f"host {result['host']} is down ({how})")
    moved, names = result["moved"], result["names"]
    if moved:
        show(
            result,
            False,
            f"{len(moved)} VMs started elsewhere",
            ("vm", "destination"),
            [(names.get(vm, vm), moved[vm]) for vm in result["order"] if vm in moved],
        )
    for u in result["unplaced"]:
        why = format_explanation(u["explanation"]) if u["explanation"] else u["reason"]
        say(f"VM {names.get(u['vm'], u['vm'])} fits nowhere, still claimed on the host: {why}")
    for vm, outcome in result["taken_over"].items():
        if outcome == "landed":
            say(f"VM {names.get(vm, vm)} was migrating away: started on {moved.get(vm)} instead")
        else:
            say(f"VM {names.get(vm, vm)} was migrating to {result['host']}: migration aborted")
    if result["deferred"]:
        say(f"{len(result['deferred'])} VMs not tagged ha wait for the next pass")
    if not (moved or result["unplaced"] or result["taken_over"] or result["deferred"]):
        say(f"no VMs left on {result['host']}")


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
    say(f"{name}: traits {cell(result['traits'])}")


@host_app.command("set-aggregates")
def host_set_aggregates(
    name: HostArg,
    aggregates: Annotated[
        list[str] | None, typer.Argument(help="the host's new aggregates")
    ] = None,
) -> None:
    """Replace the host's aggregates (none given: clear them)."""
    result = _replace_set(name, "aggregates", aggregates or [])
    say(f"{name}: aggregates {cell(result['aggregates'])}")
