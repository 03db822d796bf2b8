"""The CLI: typer's runner for the many quick commands, real processes for the entry
point, the exit codes and the server itself."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from cli_helpers import ADMIN, READER, free_port, run_cli, start_server, stop_server
from typer.testing import CliRunner

import loadmaster
from loadmaster.cli import app
from loadmaster.policy import shipped_policy_dir

runner = CliRunner()


def cli(server: str, *args: str, token: str = ADMIN) -> tuple[int, str]:
    result = runner.invoke(app, ["--url", server, "--token", token, *args])
    return result.exit_code, result.output


def ok(server: str, *args: str) -> str:
    code, output = cli(server, *args)
    assert code == 0, output
    return output


def test_help_documents_the_exit_codes() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "3 not found" in text and "4 conflict or no valid host" in text
    assert "5 cannot connect" in text
    for command in ("serve", "demo", "host", "vm", "schedule", "capacity", "agent", "policy"):
        assert command in result.stdout


def test_cluster_from_the_command_line(server: str) -> None:
    ok(
        server,
        "host",
        "create",
        "c1",
        "-i",
        "VCPU=8,allocation_ratio=2",
        "-i",
        "MEMORY_MB=16384",
        "-t",
        "HW_CPU_X86_AVX2",
    )
    ok(server, "host", "create", "c2", "-i", "VCPU=8", "-i", "MEMORY_MB=16384", "-a", "rack-9")
    hosts = json.loads(ok(server, "host", "list", "--json"))["hosts"]
    assert {"c1", "c2"} <= {h["name"] for h in hosts}
    assert "HW_CPU_X86_AVX2" in ok(server, "host", "list")

    ok(server, "flavor", "create", "cli.small", "-r", "VCPU=2", "-r", "MEMORY_MB=2048")
    ok(server, "group", "create", "cli-web", "--policy", "anti-affinity")
    created = json.loads(
        ok(
            server,
            "vm",
            "create",
            "cli-vm-1",
            "-f",
            "cli.small",
            "--group",
            "cli-web",
            "--start",
            "--json",
        )
    )
    assert created["state"] == "pending"
    assert "running" in ok(server, "vm", "up", "cli-vm-1")
    shown = json.loads(ok(server, "vm", "show", "cli-vm-1", "--json"))
    assert shown["state"] == "running" and shown["allocations"]["allocations"]

    usage = json.loads(ok(server, "usage", "--json"))["hosts"]
    assert usage[shown["host"]]["VCPU"]["active"] == 2
    assert "VCPU per host" in ok(server, "usage", "--top", "1")
    assert "cli-web" in ok(server, "group", "list")

    capacity = json.loads(ok(server, "capacity", "cli.small", "--json"))
    assert capacity["total"] > 0
    dry = ok(server, "schedule", "--flavor", "cli.small", "--count", "2", "--dry-run", "--explain")
    assert "2 placed" in dry and "hosts fit" in dry

    traits = ok(server, "host", "set-traits", "c2", "STORAGE_DISK_SSD")
    assert "STORAGE_DISK_SSD" in traits
    assert "rack-1" in ok(server, "host", "set-aggregates", "c2", "rack-1")
    moved = json.loads(ok(server, "vm", "migrate", "cli-vm-1", "--reason", "test", "--json"))
    assert moved["vm"]["state"] == "migrating"
    assert "stopped" in ok(server, "vm", "stop", "cli-vm-1")
    ok(server, "vm", "delete", "cli-vm-1")


def test_exit_codes(server: str) -> None:
    ok(server, "host", "create", "exit-host", "-i", "VCPU=8", "-i", "MEMORY_MB=4096")
    ok(server, "flavor", "create", "exit.flavor", "-r", "VCPU=64")
    code, output = cli(server, "flavor", "show", "nope")
    assert code == 3 and "loadmaster.not_found" in output
    code, output = cli(server, "flavor", "create", "exit.flavor", "-r", "VCPU=1")
    assert code == 4 and "loadmaster.conflict" in output
    code, output = cli(server, "host", "create", "x", "-i", "VCPU")
    assert code == 2
    code, output = cli(server, "flavor", "create", "reader.flavor", "-r", "VCPU=1", token=READER)
    assert code == 1 and "loadmaster.forbidden" in output

    # The real entry point, in its own process.
    vm = run_cli("vm", "create", "too-big", "-f", "exit.flavor", "--json", url=server)
    assert vm.returncode == 0, vm.stderr
    refused = run_cli("vm", "start", "too-big", url=server)
    assert refused.returncode == 4
    assert "no_valid_host" in refused.stderr and "resources" in refused.stderr
    assert run_cli("host", "show", "ghost", url=server).returncode == 3
    assert run_cli("flavor", "list", url=server, token=None).returncode == 1
    unreachable = run_cli("flavor", "list", url=f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 5 and "cannot reach" in unreachable.stderr
    assert run_cli("host", "list", "--bogus", url=server).returncode == 2


def test_serve_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path / 'x.db'}"
    workers = run_cli("serve", "--db", sqlite, "--workers", "2", "--no-auth")
    assert workers.returncode == 2 and "needs PostgreSQL" in workers.stderr
    no_tokens = run_cli("serve", "--db", sqlite)
    assert no_tokens.returncode == 2 and "no tokens configured" in no_tokens.stderr


@pytest.mark.postgres
def test_serve_with_workers_on_postgresql(pg_url: str) -> None:
    port = free_port()
    process = start_server(["--db", pg_url, "--workers", "2", "--no-auth"], port)
    try:
        url = f"http://127.0.0.1:{port}"
        created = run_cli("host", "create", "pg-1", "-i", "VCPU=4", url=url, token=None)
        assert created.returncode == 0, created.stderr
        for _ in range(6):  # whichever worker answers sees the same database
            listed = run_cli("host", "list", "--json", url=url, token=None)
            assert [h["name"] for h in json.loads(listed.stdout)["hosts"]] == ["pg-1"]
    finally:
        stop_server(process)


def test_policy_commands(tmp_path: Path) -> None:
    shipped = sorted(str(p) for p in shipped_policy_dir().glob("*.policy"))
    result = runner.invoke(app, ["policy", "check", *shipped])
    assert result.exit_code == 0, result.output
    broken = tmp_path / "broken.policy"
    broken.write_text("(defvar x\n")
    assert runner.invoke(app, ["policy", "check", str(broken)]).exit_code == 1

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(
        json.dumps(
            {
                "host": {"stats": {"mem_available": 8_000_000, "mem_free": 400_000}},
                "guests": [
                    {
                        "name": "vm-1",
                        "stats": {
                            "balloon_cur": 2_000_000,
                            "balloon_max": 2_000_000,
                            "balloon_min": 500_000,
                            "mem_unused": 1_000_000,
                        },
                        "tags": ["best-effort"],
                    }
                ],
            }
        )
    )
    evaluated = run_cli("policy", "eval", *shipped, "--snapshot", str(snapshot))
    assert evaluated.returncode == 0, evaluated.stderr
    assert set(json.loads(evaluated.stdout)) == {
        "host",
        "guests",
        "missing_stats",
        "left_out",
        "refused",
        "tick_skipped",
        "stop_or_migrate",
    }


def test_agent_and_host_simulation(tmp_path: Path) -> None:
    policy_dir = str(shipped_policy_dir())
    agent = runner.invoke(
        app,
        [
            "agent",
            "--hypervisor",
            "test:///default",
            "--policy-dir",
            policy_dir,
            "--interval",
            "0",
            "--cycles",
            "1",
            "--host-name",
            "t1",
        ],
    )
    assert agent.exit_code == 0, agent.output
    assert "cycle 1" in agent.output
    simulated = runner.invoke(
        app, ["simulate-host", "--guests", "6", "--steps", "8", "--out", str(tmp_path / "sim")]
    )
    assert simulated.exit_code == 0, simulated.output
    assert (tmp_path / "sim").is_dir() and any((tmp_path / "sim").glob("*.html"))
    assert os.path.getsize(next((tmp_path / "sim").glob("*.html"))) > 0


def test_audit_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    loadmaster.open(url).close()
    result = runner.invoke(app, ["audit", "--db", url])
    assert result.exit_code == 0 and "no problems found" in result.output


def test_agent_guest_kernel_needs_its_initrd(tmp_path: Path) -> None:
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"")
    result = runner.invoke(
        app,
        [
            "agent",
            "--hypervisor",
            "test:///default",
            "--policy-dir",
            str(shipped_policy_dir()),
            "--cycles",
            "1",
            "--guest-kernel",
            str(kernel),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "--guest-kernel and --guest-initrd go together" in result.output


def test_host_import_registers_a_file_of_hosts_a_chunk_a_request(
    server: str, tmp_path: Path
) -> None:
    hosts = [
        {"name": f"imp-{i}", "inventories": {"VCPU": {"total": 8}}, "aggregates": ["rack-4"]}
        for i in range(25)
    ]
    file = tmp_path / "hosts.json"
    file.write_text(json.dumps({"hosts": hosts}))
    assert "registered 25 hosts" in ok(server, "host", "import", str(file), "--chunk", "10")
    listed = json.loads(ok(server, "host", "list", "--aggregate", "rack-4", "--json"))["hosts"]
    assert sorted(h["name"] for h in listed) == sorted(h["name"] for h in hosts)

    # The second request of three is refused: the first landed, it and the third did not.
    more = [{"name": f"more-{i}", "inventories": {"VCPU": {"total": 8}}} for i in range(25)]
    more[13]["inventories"] = {"VCPU": {"total": 0}}
    file.write_text(json.dumps(more))
    code, output = cli(server, "host", "import", str(file), "--chunk", "10")
    assert code == 1
    assert "hosts[3].inventories.VCPU.total" in output
    assert "hosts 10..19" in output and "10 registered before it" in output
    names = {h["name"] for h in json.loads(ok(server, "host", "list", "--json"))["hosts"]}
    assert {f"more-{i}" for i in range(10)} <= names
    assert not {f"more-{i}" for i in range(10, 25)} & names

    file.write_text("[]")
    code, output = cli(server, "host", "import", str(file))
    assert code == 2 and "expected a list of hosts" in output


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("VCPU", "write CLASS=AMOUNT"),
        ("=2", "write CLASS=AMOUNT"),
        ("VCPU=", "the amount must be a whole number of 0 or more"),
        ("VCPU=two", "the amount must be a whole number of 0 or more"),
        ("VCPU=1.5", "the amount must be a whole number of 0 or more"),
        ("VCPU=-1", "the amount must be a whole number of 0 or more"),
        ("vcpu=2", "a resource class is upper case letters, digits and _"),
    ],
)
def test_malformed_resource_values_are_usage_errors(server: str, value: str, reason: str) -> None:
    """One code for every malformed -r, as click gives its own usage errors, and a
    message naming the value and what is wrong with it; nothing is created."""
    code, output = cli(server, "flavor", "create", "malformed.flavor", "-r", value)
    assert code == 2, output
    assert f"--resource {value!r}: {reason}" in output
    assert cli(server, "flavor", "show", "malformed.flavor")[0] == 3


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("VCPU", "write CLASS=TOTAL[,field=value...]"),
        ("VCPU=", "write CLASS=TOTAL[,field=value...]"),
        ("VCPU=-1", "total: '-1' is not a whole number of 0 or more"),
        ("VCPU=8.5", "total: '8.5' is not a whole number of 0 or more"),
        ("vcpu=8", "a resource class is upper case letters, digits and _"),
        ("VCPU=8,ratio=2", "'ratio' is not an inventory field"),
        ("VCPU=8,reserved", "write field=value after the total, not 'reserved'"),
        ("VCPU=8,reserved=x", "reserved: 'x' is not a whole number of 0 or more"),
        ("VCPU=8,allocation_ratio=four", "allocation_ratio: 'four' is not a number"),
        ("VCPU=8,allocation_ratio=0", "allocation_ratio must be more than 0"),
    ],
)
def test_malformed_inventory_values_are_usage_errors(server: str, value: str, reason: str) -> None:
    """``host create -i`` exited 2, 1 or 3 for values equally malformed, by whether the
    client or the server noticed: now each is a usage error naming the value."""
    code, output = cli(server, "host", "create", "malformed-host", "-i", value)
    assert code == 2, output
    assert f"--inventory {value!r}: {reason}" in output
    assert cli(server, "host", "show", "malformed-host")[0] == 3


def test_a_refused_amount_names_its_field_and_reason_once(server: str) -> None:
    code, output = cli(server, "host", "create", "refused-host", "-i", "VCPU=0")
    assert code == 1, output
    assert output.strip() == (
        "error: inventories.VCPU.total: must be at least 1, got 0 [loadmaster.invalid]"
    )


def test_vm_from_an_image_with_a_nic(server: str, tmp_path: Path) -> None:
    image = tmp_path / "cli-img.qcow2"
    # A qcow2 header saying 32 MiB: all the CLI reads of the file.
    image.write_bytes(
        b"QFI\xfb" + (3).to_bytes(4, "big") + bytes(16) + (32 << 20).to_bytes(8, "big")
    )
    added = json.loads(ok(server, "image", "add", "cli-img", str(image), "--json"))
    assert added["size_bytes"] == 32 << 20
    assert "cli-img" in ok(server, "image", "list")
    code, out = cli(server, "image", "add", "cli-img2", str(tmp_path / "absent.qcow2"))
    assert code == 2 and "absent.qcow2" in out

    ok(
        server,
        "flavor",
        "create",
        "cli.disk",
        "-r",
        "VCPU=1",
        "-r",
        "MEMORY_MB=512",
        "-r",
        "DISK_GB=1",
    )
    ok(
        server,
        "vm",
        "create",
        "cli-img-vm",
        "-f",
        "cli.disk",
        "--image",
        "cli-img",
        "--network",
        "lan",
    )
    shown = ok(server, "vm", "show", "cli-img-vm")
    assert "disk: image cli-img, 1073741824 bytes, volume loadmaster/" in shown
    assert re.search(r"nic: network lan, MAC 52:54:00(:[0-9a-f]{2}){3}", shown), shown
    code, out = cli(server, "vm", "create", "cli-bad", "-f", "cli.disk", "--image", "nope")
    assert code != 0 and "no such image 'nope'" in out
    code, out = cli(server, "image", "delete", "cli-img")
    assert code != 0 and "used by 1 VMs" in out


def test_agent_pool_options_are_its_storage(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--pool-dir, --image-dir and --pool-shared NAME reach the agent as its StorageConfig;
    a pool is private unless declared shared, by name."""
    from loadmaster.agent.hypervisor.storage import StorageConfig

    given: list[StorageConfig | None] = []

    def run_agent(*_args: object, storage: StorageConfig | None, **_kwargs: object) -> list[None]:
        given.append(storage)
        return []

    monkeypatch.setattr("loadmaster.agent.run_agent", run_agent)
    base = ["agent", "--hypervisor", "test:///default", "--policy-dir", str(tmp_path)]
    pool = ["--pool-dir", str(tmp_path / "pool"), "--image-dir", str(tmp_path)]
    for extra in ([], ["--pool-shared", "nfs-a"]):
        result = runner.invoke(app, [*base, *pool, *extra])
        assert result.exit_code == 0, result.output
    assert given == [
        StorageConfig(pool_dir=tmp_path / "pool", image_dir=tmp_path.resolve(), shared=None),
        StorageConfig(pool_dir=tmp_path / "pool", image_dir=tmp_path.resolve(), shared="nfs-a"),
    ]
