"""What an operator reads: flavors from extra specs alone (unknown ones refused or warned
about by name), schedule by VM names with one line per failure reason, capacity sorted by
how many fit with the reason where none does."""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import ADMIN
from typer.testing import CliRunner

from loadmaster.cli import app

runner = CliRunner()


def cli(server: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--url", server, "--token", ADMIN, *args])
    return result.exit_code, result.output


def ok(server: str, *args: str) -> str:
    code, output = cli(server, *args)
    assert code == 0, output
    return output


def test_flavor_from_extra_specs_and_unknown_specs(server: str) -> None:
    created = json.loads(
        ok(
            server,
            "flavor",
            "create",
            "ert.small",
            "--extra-spec",
            "resource:VCPU=1",
            "--extra-spec",
            "resources:MEMORY_MB=1024",
            "--json",
        )
    )
    assert created["resources"] == {"VCPU": 1, "MEMORY_MB": 1024}
    assert created["warnings"] == []

    code, output = cli(
        server, "flavor", "create", "odd", "-r", "VCPU=1", "--extra-spec", "hw:foo=1"
    )
    assert code != 0 and "extra_specs.hw:foo" in output and "understands" in output
    code, _ = cli(server, "flavor", "show", "odd")
    assert code == 3  # the refused flavor was not created

    warned = ok(
        server,
        "flavor",
        "create",
        "odd",
        "-r",
        "VCPU=1",
        "--extra-spec",
        "hw:foo=1",
        "--unknown-specs",
        "warn",
    )
    assert "warning: extra_specs.hw:foo is not understood and is ignored" in warned
    code, output = cli(
        server,
        "flavor",
        "create",
        "agg",
        "-r",
        "VCPU=1",
        "--extra-spec",
        "aggregate_instance_extra_specs:ssd=true",
        "--unknown-specs",
        "warn",
    )
    assert code != 0 and "aggregates carry no metadata" in output


def test_schedule_and_capacity_speak_in_names_and_reasons(server: str) -> None:
    for i, memory in enumerate((8192, 4096, 2048)):
        ok(server, "host", "create", f"op{i}", "-i", "VCPU=16", "-i", f"MEMORY_MB={memory}")
    ok(
        server,
        "host",
        "create",
        "op-down",
        "-i",
        "VCPU=16",
        "-i",
        "MEMORY_MB=8192",
        "--state",
        "maintenance",
    )
    ok(server, "flavor", "create", "op.1g", "-r", "VCPU=1", "-r", "MEMORY_MB=1024")
    ok(server, "flavor", "create", "op.3g", "-r", "VCPU=1", "-r", "MEMORY_MB=3072")

    capacity = ok(server, "capacity", "op.3g")
    hosts = re.findall(r"^\W*(op[\w-]*)\W+(\d+)", capacity, re.M)
    # Most first, then the hosts where none fits (by name), each with its reason.
    assert hosts == [("op0", "2"), ("op1", "1"), ("op-down", "0"), ("op2", "0")], capacity
    data = json.loads(ok(server, "capacity", "op.3g", "--json"))
    assert list(data["per_host"].items()) == [("op0", 2), ("op1", 1)]
    assert data["limits"] == {
        "op-down": "maintenance",
        "op2": "MEMORY_MB short by 1024 (free 2048 of 3072)",
    }
    assert "MEMORY_MB short by 1024" in capacity and "maintenance" in capacity

    ok(server, "group", "create", "op-db", "--policy", "affinity")
    for i in range(9):
        ok(server, "vm", "create", f"op-db-{i}", "-f", "op.1g", "--group", "op-db")
    names = [f"op-db-{i}" for i in range(9)]
    code, output = cli(server, "schedule", *names, "--explain", "--seed", "5")
    text = " ".join(output.split())
    assert code == 4, output
    reason = "hard affinity group op-db needs 9 VMs on one host; the best host op0 fits 8 (limited by MEMORY_MB)"
    # Said once for the nine VMs; the explanation adds what it has more, not the same again.
    assert text.count(reason) == 1, output
    assert "9 VMs not placed: " + reason in text
    assert "no host fits: 4 hosts; 3 short of MEMORY_MB, 1 maintenance" in text, output
    assert "op-db-0" in output and "seed 5" in output

    placed = ok(server, "schedule", *names[:4], "--seed", "5")
    assert "op-db-3" in placed and "op0" in placed
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", placed), placed  # names, not uuids


def test_vm_start_on_a_chosen_host(server: str) -> None:
    for i, memory in enumerate((8192, 2048)):
        ok(server, "host", "create", f"pin{i}", "-i", "VCPU=16", "-i", f"MEMORY_MB={memory}")
    ok(server, "flavor", "create", "pin.3g", "-r", "VCPU=1", "-r", "MEMORY_MB=3072")
    ok(server, "vm", "create", "pinned", "-f", "pin.3g")
    code, output = cli(server, "vm", "start", "pinned", "--host", "pin1")
    assert code != 0
    assert "cannot start on host pin1: short of MEMORY_MB (resources)" in output, output
    started = json.loads(ok(server, "vm", "start", "pinned", "--host", "pin0", "--json"))
    assert started["placement"]["host"] == "pin0"


def test_errors_name_what_the_operator_typed(server: str) -> None:
    """A host or VM is named as the operator named it, in an operator's words; Placement's
    own routes keep Placement's words, which its clients look for."""
    ok(server, "host", "create", "words-1", "-i", "VCPU=2", "-i", "MEMORY_MB=2048")
    ok(server, "flavor", "create", "words.big", "-r", "VCPU=100000")
    ok(server, "flavor", "create", "words.small", "-r", "VCPU=1")
    ok(server, "vm", "create", "words-vm", "-f", "words.big")
    code, output = cli(server, "vm", "start", "words-vm", "--host", "node-zz")
    assert code == 3 and "host 'node-zz': no such host" in output, output
    assert "resource provider" not in output and "uuid" not in output, output
    code, output = cli(server, "vm", "start", "words-vm")
    assert code == 4 and output.startswith("error: VM words-vm: no host fits"), output
    assert output.count("no host fits") == 1, output  # the explanation is not said again
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", output), output
    code, output = cli(server, "vm", "start", "words-vm", "--host", "words-1")
    assert code == 4, output
    assert output.startswith("error: VM words-vm cannot start on host words-1: short of VCPU")
    assert "no host fits" not in output, output  # one host named: its reasons said once
    code, output = cli(server, "vm", "stop", "words-vm")
    assert code == 4 and "VM words-vm is requested and cannot be stopped" in output, output
    ok(server, "vm", "create", "words-run", "-f", "words.small")
    ok(server, "vm", "start", "words-run", "--host", "words-1")
    ok(server, "vm", "up", "words-run")
    code, output = cli(server, "vm", "migrate", "words-run", "--host", "words-1")
    assert code == 4, output
    assert "VM words-run cannot move to host words-1: excluded (where the VM runs" in output
    assert "exclude_hosts" not in output, output
    code, output = cli(server, "vm", "start", "words-run")
    assert code == 4 and "VM words-run is already running on its host" in output, output
    assert ok(server, "vm", "delete", "words-vm").strip() == "VM words-vm deleted"

    import httpx

    headers = {"Authorization": f"Bearer {ADMIN}"}
    placement = httpx.get(f"{server}/resource_providers/node-zz", headers=headers)
    assert placement.status_code == 404
    assert placement.json()["errors"][0]["detail"] == "No resource provider with uuid node-zz found"
    own = httpx.get(f"{server}/hosts/node-zz", headers=headers)
    assert own.status_code == 404 and own.json()["detail"] == "host 'node-zz': no such host"


def test_small_things_an_operator_reads(server: str) -> None:
    """The flag an unknown extra spec needs is the CLI's; a host that fits has no limit
    shown; a VM shows its tags."""
    code, output = cli(
        server, "flavor", "create", "small.odd", "-r", "VCPU=1", "--extra-spec", "hw:odd=1"
    )
    assert code == 1 and "--unknown-specs warn" in output, output
    assert "unknown_specs=warn" not in output, output
    ok(server, "host", "create", "small-1", "-i", "VCPU=4", "-i", "MEMORY_MB=4096")
    ok(server, "flavor", "create", "small.1", "-r", "VCPU=1", "-r", "MEMORY_MB=1024")
    capacity = ok(server, "capacity", "small.1", "--top", "0")
    [row] = [line for line in capacity.splitlines() if "small-1" in line]
    assert " - " not in row and "-  " not in row.replace("small-1", ""), capacity
    ok(server, "vm", "create", "small-vm", "-f", "small.1", "--tag", "gold", "--tag", "priority:2")
    shown = ok(server, "vm", "show", "small-vm")
    assert "tags gold priority:2" in shown and "flavor small.1" in shown, shown


def test_host_show_draws_the_tree_with_each_providers_inventory_and_usage(server: str) -> None:
    """An agent puts CPUs and memory on its host's NUMA cells: ``host show`` of the host
    shows them, with what is pending and active; the cells are in their host's state."""
    ok(server, "host", "create", "tree-1", "-i", "DISK_GB=100")
    for cell in (0, 1):
        name = f"tree-1_numa{cell}"
        ok(
            server,
            "host",
            "create",
            name,
            "--parent",
            "tree-1",
            "-i",
            "VCPU=4",
            "-i",
            "MEMORY_MB=4096",
        )
    ok(server, "flavor", "create", "tree.small", "-r", "VCPU=1", "-r", "MEMORY_MB=1024")
    ok(server, "vm", "create", "tree-vm", "-f", "tree.small")
    ok(server, "vm", "start", "tree-vm", "--host", "tree-1")
    borders = r"[│┃┏┓┗┛┡┩└┘├┤┬┴┼━─╇┳]+"
    shown = " ".join(re.sub(borders, " ", ok(server, "host", "show", "tree-1")).split())
    assert "tree-1 DISK_GB 100" in shown, shown
    for cell in (0, 1):
        assert f"tree-1_numa{cell} VCPU 4" in shown and f"tree-1_numa{cell} MEMORY_MB 4096" in shown
    # The VM's 1 VCPU and 1024 MB are pending on one cell.
    assert re.search(r"tree-1_numa\d VCPU 4 0 1.0 4 0 1 3", shown), shown
    data = json.loads(ok(server, "host", "show", "tree-1", "--json"))
    assert [c["name"] for c in data["children"]] == ["tree-1_numa0", "tree-1_numa1"]

    ok(server, "host", "state", "tree-1", "maintenance")
    listed = json.loads(ok(server, "host", "list", "--json"))["hosts"]
    states = {h["name"]: h["state"] for h in listed if h["name"].startswith("tree-1")}
    assert states == dict.fromkeys(("tree-1", "tree-1_numa0", "tree-1_numa1"), "maintenance")
    only = json.loads(ok(server, "host", "list", "--state", "maintenance", "--json"))["hosts"]
    assert {"tree-1_numa0", "tree-1_numa1"} <= {h["name"] for h in only}
    code, output = cli(server, "host", "state", "tree-1_numa0", "up")
    assert code == 1 and "child provider" in output and "root host" in output, output


def test_text_from_the_server_is_printed_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """A MAC's ":ab:" is not an emoji code, in a line or in a table."""
    from loadmaster.cli.output import console, show

    console().print("nic: network default, MAC 52:54:00:ab:02:70")
    show({}, False, "NICs", ["mac"], [["52:54:00:ab:cd:ef"]])
    out = capsys.readouterr().out
    assert "MAC 52:54:00:ab:02:70" in out and "52:54:00:ab:cd:ef" in out, out
