"""The operator's surface of the CLI: help everywhere, options after the subcommand, the
commands that used to be API-only, one-line errors, --debug and shell completion."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from cli_helpers import ADMIN, READER, run_cli
from typer.testing import CliRunner

from loadmaster.cli import app, main
from loadmaster.cli.remote import hosts as host_commands
from loadmaster.policy import shipped_policy_dir

runner = CliRunner()


def ok(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_option_and_argument_has_help() -> None:
    missing: list[str] = []

    def walk(command: typer.core.TyperGroup | typer.core.TyperCommand, path: str) -> None:
        if not (command.help or "").strip():
            missing.append(path)
        for param in command.params:
            if not (getattr(param, "help", None) or "").strip():
                missing.append(f"{path} {param.name}")
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "loadmaster")  # type: ignore[arg-type]
    assert missing == []


def test_shell_completion_script() -> None:
    result = run_cli("--show-completion", "bash")
    assert result.returncode == 0, result.stderr
    assert "_LOADMASTER_COMPLETE" in result.stdout and "complete " in result.stdout


def test_url_and_token_after_the_subcommand(server: str) -> None:
    listed = run_cli("host", "list", "--json", "--url", server, "--token", ADMIN, token=None)
    assert listed.returncode == 0, listed.stderr
    assert "hosts" in json.loads(listed.stdout)
    # After the subcommand they win over the environment.
    overridden = run_cli("host", "list", "--url", server, url="http://127.0.0.1:1")
    assert overridden.returncode == 0, overridden.stderr
    refused = run_cli("host", "list", "--token", "wrong", url=server)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr


def test_commands_that_were_api_only(server: str) -> None:
    base = ["--url", server, "--token", ADMIN]
    long_class = "CUSTOM_" + "VERY_LONG_ACCELERATOR_CLASS_NAME_" * 3 + "X"
    ok(*base, "class", "create", long_class, "--unit", "card", "--description", "for tests")
    assert "card" in ok(*base, "class", "show", long_class)
    assert long_class in ok(*base, "class", "list")
    ok(*base, "trait", "create", "CUSTOM_SURFACE_FAST")
    assert "CUSTOM_SURFACE_FAST" in ok(*base, "trait", "list")

    ok(*base, "host", "create", "sf-1", "-i", "VCPU=8", "-i", "MEMORY_MB=8192")
    ok(*base, "host", "create", "sf-1-numa0", "--parent", "sf-1", "-i", f"{long_class}=2")
    listed = json.loads(ok(*base, "host", "list", "--json"))["hosts"]
    by_name = {h["name"]: h for h in listed}
    assert by_name["sf-1-numa0"]["parent_provider_uuid"] == by_name["sf-1"]["uuid"]
    tree = ok(*base, "host", "tree").splitlines()
    assert tree.index("  sf-1-numa0 (up)") == tree.index("sf-1 (up)") + 1
    # A class name wider than the terminal is printed whole, not cut.
    assert long_class in ok(*base, "host", "show", "sf-1-numa0")

    ok(*base, "host", "set-inventory", "sf-1", "VCPU=16,allocation_ratio=2")
    inventories = json.loads(ok(*base, "host", "show", "sf-1", "--json"))["inventories"]
    assert inventories["VCPU"]["total"] == 16 and inventories["VCPU"]["allocation_ratio"] == 2
    bad = runner.invoke(app, [*base, "host", "set-inventory", "sf-1", "VCPU=lots"])
    assert (
        bad.exit_code == 2 and "INVENTORY 'VCPU=lots': total: 'lots' is not a whole" in bad.output
    )

    ok(*base, "flavor", "create", "sf.small", "-r", "VCPU=2", "-r", "MEMORY_MB=1024")
    ok(*base, "group", "create", "sf-web", "--policy", "anti-affinity")
    for i in range(3):
        tags = ["--tag", "gold"] if i else []
        ok(*base, "vm", "create", f"sf-vm-{i}", "-f", "sf.small", "--group", "sf-web", *tags)
    ok(*base, "vm", "start", "sf-vm-0")
    ok(*base, "vm", "up", "sf-vm-0")
    gold = json.loads(ok(*base, "vm", "list", "--tag", "gold", "--json"))["vms"]
    assert sorted(v["name"] for v in gold) == ["sf-vm-1", "sf-vm-2"]
    page = json.loads(
        ok(*base, "vm", "list", "--group", "sf-web", "--limit", "1", "--offset", "1", "--json")
    )
    assert [v["name"] for v in page["vms"]] == ["sf-vm-1"]
    assert "gold" in ok(*base, "vm", "list", "--name", "sf-vm-2")
    members = ok(*base, "group", "show", "sf-web")
    assert "sf-vm-0" in members and "sf-1" in members

    report = ok(*base, "host", "report", "sf-1")
    assert "agent none" in report and "sf-vm-0" in report
    not_migrating = runner.invoke(app, [*base, "vm", "abort-migration", "sf-vm-0"])
    assert not_migrating.exit_code == 4 and "not migrating" in not_migrating.output

    policies = json.loads(ok(*base, "policies", "--json"))
    assert policies["default"] in {p["name"] for p in policies["policies"]}

    for how in (["--remote", "--url", server], ["--url", server]):
        audited = runner.invoke(app, ["audit", *how, "--token", READER])
        assert audited.exit_code == 0 and "no problems found" in audited.output


def test_abort_migration(server: str) -> None:
    base = ["--url", server, "--token", ADMIN]
    for name in ("ab-1", "ab-2"):
        ok(*base, "host", "create", name, "-i", "VCPU=4", "-i", "MEMORY_MB=4096", "-a", "ab")
    ok(*base, "flavor", "create", "ab.tiny", "-r", "VCPU=1", "-r", "MEMORY_MB=512")
    ok(*base, "vm", "create", "ab-vm", "-f", "ab.tiny")
    placed = json.loads(ok(*base, "vm", "start", "ab-vm", "--json"))
    ok(*base, "vm", "up", "ab-vm")
    source = placed["vm"]["host"]
    target = "ab-2" if source == "ab-1" else "ab-1"
    ok(*base, "vm", "migrate", "ab-vm", "--host", target)
    incoming = json.loads(ok(*base, "vm", "list", "--host", target, "--json"))["vms"]
    assert [v["name"] for v in incoming] == ["ab-vm"]
    assert f"{source} -> {target}" in ok(*base, "vm", "list", "--name", "ab-vm")
    ok(*base, "vm", "abort-migration", "ab-vm")
    vm = json.loads(ok(*base, "vm", "show", "ab-vm", "--json"))
    assert vm["state"] == "running" and vm["host"] == source and vm["target_host"] is None


def test_audit_refuses_a_missing_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["audit"])
    assert result.exit_code == 2
    assert f"no database at {tmp_path / 'loadmaster.db'}" in result.output
    assert not (tmp_path / "loadmaster.db").exists()
    for url, reason in (("nonsense", "not a database URL"), ("mysql://x/y", "only sqlite")):
        bad = runner.invoke(app, ["audit", "--db", url])
        assert bad.exit_code == 2 and reason in bad.output and len(bad.output.splitlines()) == 1


def test_serve_names_a_database_it_cannot_open(tmp_path: Path) -> None:
    result = run_cli("serve", "--no-auth", "--db", f"sqlite:///{tmp_path}/no/such/dir/lm.db")
    assert result.returncode == 5, result.stderr
    assert "unable to open database file" in result.stderr and "Traceback" not in result.stderr


def test_unexpected_errors_are_one_line_unless_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(host_commands, "api", broken)
    monkeypatch.setattr(sys, "argv", ["loadmaster", "host", "list"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        "error: RuntimeError: boom (run again with --debug for the traceback)\n"
    )
    monkeypatch.setattr(sys, "argv", ["loadmaster", "host", "list", "--debug"])
    with pytest.raises(RuntimeError, match="boom"):
        main()


def test_policy_commands_take_a_directory(tmp_path: Path) -> None:
    directory = str(shipped_policy_dir())
    assert "file(s) OK" in ok("policy", "check", directory)
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"host": {"stats": {}}, "guests": []}))
    result = runner.invoke(app, ["policy", "eval", directory, "--snapshot", str(snapshot)])
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)) >= {"host", "guests"}
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = runner.invoke(app, ["policy", "check", str(empty)])
    assert refused.exit_code == 2 and "no *.policy file" in refused.output


def test_agent_takes_url_and_the_old_api_name() -> None:
    both = runner.invoke(
        app,
        [
            "agent",
            "--hypervisor",
            "test:///default",
            "--policy-dir",
            str(shipped_policy_dir()),
            "--url",
            "http://a:1",
            "--api",
            "http://b:1",
        ],
    )
    assert both.exit_code == 2 and "--api is the old name of --url" in both.output
    assert "--api" not in ok("agent", "--help")


def test_trait_list_custom_leaves_the_standard_traits_out(server: str) -> None:
    base = ["--url", server, "--token", ADMIN]
    ok(*base, "trait", "create", "CUSTOM_ONLY_MINE")
    everything = json.loads(ok(*base, "trait", "list", "--json"))["traits"]
    assert "HW_CPU_X86_AVX2" in everything and "CUSTOM_ONLY_MINE" in everything
    custom = json.loads(ok(*base, "trait", "list", "--custom", "--json"))["traits"]
    assert "CUSTOM_ONLY_MINE" in custom
    assert custom == [t for t in everything if t.startswith("CUSTOM_")]
    assert "HW_CPU_X86_AVX2" not in ok(*base, "trait", "list", "--custom")


HEAVY = {
    "sqlalchemy",
    "fastapi",
    "numpy",
    "httpx",
    "alembic",
    "uvicorn",
    "rich",
    "pydantic_settings",
}


def heavy_imports(server: str, *args: str) -> set[str]:
    """The heavy packages the real entry point loads for one command (in a new process)."""
    probe = (
        "import atexit, sys\n"
        f"sys.argv = ['loadmaster', *{list(args)!r}]\n"
        "atexit.register(lambda: print(sorted({m.split('.')[0] for m in sys.modules}), "
        "file=sys.stderr))\n"
        "from loadmaster.cli import main\n"
        "main()\n"
    )
    env = {**os.environ, "LOADMASTER_URL": server, "LOADMASTER_TOKEN": ADMIN}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = ast.literal_eval(done.stderr.strip().splitlines()[-1])
    return HEAVY & set(loaded)


def test_quick_commands_load_no_heavy_package(server: str) -> None:
    assert heavy_imports(server, "--help") == set()
    assert heavy_imports(server, "host", "list", "--help") == set()
    assert heavy_imports(server, "host", "list", "--json") == set()
    # A table needs rich, and nothing else.
    assert heavy_imports(server, "host", "list") == {"rich"}
