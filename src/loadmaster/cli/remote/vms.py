"""``loadmaster vm ...``: VMs and their lifecycle."""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from loadmaster.cli.app import api, remote_group
from loadmaster.cli.client import Exit, fail
from loadmaster.cli.output import VM_COLUMNS, JsonOpt, VmArg, say, show, vm_row, warn

vm_app = remote_group("vm", "VMs and their lifecycle.")


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
    show(data, as_json, "VMs", VM_COLUMNS, [vm_row(v) for v in data["vms"]])
    if not as_json:
        warn(data["warnings"])


def guest_device_lines(vm: Mapping[str, Any]) -> list[str]:
    """The disks and NICs of a VM as ``GET /vms/{uuid}`` answers, one line each."""
    return [
        f"disk: image {disk['image'] or '- (blank)'}, {disk['size_bytes']} bytes, "
        f"volume {disk['volume']}"
        for disk in vm["disks"]
    ] + [f"nic: network {nic['network']}, MAC {nic['mac']}" for nic in vm["nics"]]


@vm_app.command("show")
def vm_show(vm: VmArg, as_json: JsonOpt = False) -> None:
    """A VM, its disks and NICs, its last fault, what it holds on which host (active,
    pending) and the host devices its agent gave it."""
    client = api()
    uuid = vm_uuid(vm)
    data = {**client.get(f"/vms/{uuid}"), "allocations": client.get(f"/vms/{uuid}/allocations")}
    data["devices"] = client.get(f"/vms/{uuid}/devices")["devices"]
    rows = [
        (alloc["name"], state, amounts)
        for alloc in data["allocations"]["allocations"].values()
        for state in ("active", "pending")
        for amounts in [alloc[state]]
        if amounts
    ]
    title = (
        f"VM {data['name']} ({data['state']}, host {data['host'] or '-'}) {uuid}\n"
        f"flavor {data['flavor']}, group {data['group'] or '-'}, "
        f"tags {' '.join(data['tags']) or '-'}"
    )
    for line in guest_device_lines(data):
        title += f"\n{line}"
    if data.get("fault"):
        title += f"\nlast fault: {data['fault']}"
    show(data, as_json, title, ("host", "state", "resources"), rows)
    if data["devices"] and not as_json:
        show(
            data,
            False,
            "Host devices",
            ("provider", "address", "mediated device"),
            [(d["provider"], d["address"], d["mdev_uuid"] or "-") for d in data["devices"]],
        )


WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="wait until the VM runs (exit 0); exit 4 with the reason if its launch is given "
        "up (every host refused it), it stops, or --timeout passes",
    ),
]
TimeoutOpt = Annotated[float, typer.Option(help="seconds --wait waits at most")]
IntervalOpt = Annotated[float, typer.Option(help="seconds between two looks of --wait")]
DEFAULT_WAIT_S = 600.0


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
    image: Annotated[
        str | None,
        typer.Option(help="the image its disk is made from (default: its flavor's lm:image)"),
    ] = None,
    network: Annotated[
        str | None,
        typer.Option(
            help="the host network its NIC joins (default: its flavor's lm:network, else default)"
        ),
    ] = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_WAIT_S,
    interval: IntervalOpt = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """Create a VM (requested: it holds nothing until started). With --start --wait,
    exits once it runs, or 4 with the reason when its launch is given up."""
    if wait and not start:
        fail("--wait follows the start: give --start too", Exit.USAGE)
    _check_wait(timeout, interval)
    client = api()
    body: dict[str, Any] = {"name": name, "flavor": flavor, "project_id": project}
    body |= {"user_id": user, "tags": tag or [], "group": group}
    body |= {"image": image, "network": network}
    vm = client.post("/vms", body)
    if start:
        vm = client.post(f"/vms/{vm['uuid']}/start")["vm"]
    if wait:
        vm = _wait_running(vm, timeout, interval)
    show(vm, as_json, "VM created", VM_COLUMNS, [vm_row(vm)])


def _check_wait(timeout: float, interval: float) -> None:
    if timeout < 0 or interval <= 0:
        fail("--timeout must be at least 0 and --interval above 0", Exit.USAGE)


def _wait_running(vm: dict[str, Any], timeout: float, interval: float) -> dict[str, Any]:
    """The VM's record once it runs. A refused launch is placed again by the server
    (the VM is ``requested`` with the refusing hosts in ``tried_hosts`` for a moment):
    only a VM ``requested`` with none, stopped or deleted is given up, and said so with
    its fault, exit 4; so is one still not running at the timeout."""
    client = api()
    deadline = time.monotonic() + timeout
    while True:
        state = vm["state"]
        if state == "running":
            return vm
        if state in ("stopped", "deleted") or (state == "requested" and not vm["tried_hosts"]):
            fail(
                f"VM {vm['name']} is {state}, not running: "
                f"{vm['fault'] or 'no fault recorded (stopped or released by a client)'}",
                Exit.CONFLICT,
            )
        now = time.monotonic()
        if now >= deadline:
            where = f" on {vm['host']}" if vm["host"] else ""
            why = f" (last fault: {vm['fault']})" if vm["fault"] else ""
            fail(
                f"VM {vm['name']} is still {state}{where} after {timeout:g} s{why}",
                Exit.CONFLICT,
            )
        time.sleep(min(interval, deadline - now))
        vm = client.get(f"/vms/{vm['uuid']}")


def _lifecycle(vm: str, action: str, body: dict[str, Any] | None, as_json: bool) -> None:
    answer = api().post(f"/vms/{vm_uuid(vm)}/{action}", body)
    record = answer.get("vm", answer)
    show(answer, as_json, f"VM {action}", VM_COLUMNS, [vm_row(record)])


@vm_app.command("start")
def vm_start(
    vm: VmArg,
    policy: Annotated[str | None, typer.Option(help="scheduling policy (see policies)")] = None,
    host: Annotated[
        str | None,
        typer.Option(help="start it on this host (admin only; every other filter still applies)"),
    ] = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = DEFAULT_WAIT_S,
    interval: IntervalOpt = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """Schedule and claim: the VM is pending on its host until it is reported up. With
    --wait, exits once it runs, or 4 with the reason when its launch is given up."""
    if not wait:
        _lifecycle(vm, "start", {"policy": policy, "host": host}, as_json)
        return
    _check_wait(timeout, interval)
    answer = api().post(f"/vms/{vm_uuid(vm)}/start", {"policy": policy, "host": host})
    record = _wait_running(answer["vm"], timeout, interval)
    show(record, as_json, "VM start", VM_COLUMNS, [vm_row(record)])


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
    show(record, as_json, f"migration to {target} aborted", VM_COLUMNS, [vm_row(record)])


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
    say(f"VM {vm} deleted")
