"""``loadmaster host evacuate HOST --confirm-down``: refused with what to do until the host
is known down, then the VMs by name with their new hosts (highly available first), what
fits nowhere, and the exit codes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import ADMIN
from tests.api.api_helpers import run_server
from typer.testing import CliRunner

import loadmaster
from harness import ServedApi
from loadmaster.api import AuthConfig, create_app
from loadmaster.cli import app
from loadmaster.service import Loadmaster
from loadmaster.settings import OPTIONS, env_name

runner = CliRunner()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Loadmaster]]:
    """h0 (no agent, so nothing says it is alive) runs db (ha), web and huge, which fits
    on no other host."""
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'evacuate.db'}")
    for name, vcpu in (("h0", 16), ("h1", 8), ("h2", 8)):
        lm.hosts.create(name, inventories={"VCPU": {"total": vcpu}, "MEMORY_MB": {"total": 32768}})
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    lm.flavors.create({"name": "big", "resources": {"VCPU": 12, "MEMORY_MB": 1024}})
    for name, flavor, tags in (("web", "small", []), ("db", "small", ["ha"]), ("huge", "big", [])):
        vm = lm.vms.create(name, flavor, tags=tags).uuid
        lm.allocations.claim(vm, "h0")
        lm.allocations.activate(vm)
    server, thread, url = run_server(create_app(lm, AuthConfig({ADMIN: "admin"})))
    try:
        yield url, lm
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        lm.close()


def cli(url: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--url", url, "--token", ADMIN, *args])
    return result.exit_code, result.output


def test_evacuate_asks_for_confirmation_then_starts_the_vms_elsewhere(
    served: tuple[str, Loadmaster],
) -> None:
    url, lm = served
    code, output = cli(url, "host", "evacuate", "h0")
    assert code == 4, output
    assert "host h0 is not known to be down" in output and "--confirm-down" in output
    assert lm.hosts.get("h0").state == "up" and len(lm.vms.list(host="h0")) == 3

    code, output = cli(url, "host", "evacuate", "h0", "--confirm-down")
    assert code == 4, output  # huge is left on h0
    assert "host h0 is down (confirmed down by you)" in output
    assert "2 VMs started elsewhere" in output
    assert output.index("│ db ") < output.index("│ web ")  # highly available first
    assert "VM huge fits nowhere, still claimed on the host" in output
    assert "no host fits" in output
    assert {v.name for v in lm.vms.list(host="h0")} == {"huge"}

    lm.hosts.set_inventories("h1", {"VCPU": {"total": 32}, "MEMORY_MB": {"total": 32768}})
    code, output = cli(url, "host", "evacuate", "h0", "--json")
    assert code == 0, output
    data = json.loads(output)
    assert data["known_down"] == "already" and list(data["moved"].values()) == ["h1"]
    code, output = cli(url, "host", "evacuate", "h0")
    assert code == 0 and "host h0 is down (already down)" in output
    assert "no VMs left on h0" in output


def test_evacuate_names_an_unknown_host(served: tuple[str, Loadmaster]) -> None:
    url, _ = served
    code, output = cli(url, "host", "evacuate", "nosuch", "--confirm-down")
    assert code == 3 and "host 'nosuch': no such host" in output


def test_serve_takes_the_fence_command_as_an_option(tmp_path: Path) -> None:
    """``serve --fence-command``: the option reaches the server's evacuation pass, which
    fences a host whose agent fell silent (h0: registered, then never heard again) while
    another's is heard (one silent host of one would be the server's own trouble)."""
    fenced = tmp_path / "fenced.log"
    script = tmp_path / "fence.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {fenced}\n')
    script.chmod(0o755)
    options = ["--fence-command", str(script), "--agent-silent-after", "1"]
    options += ["--agent-heard-every", "0.25"]
    db = f"sqlite:///{tmp_path / 'lm.db'}"
    with ServedApi(db, 1, tmp_path / "serve.log", options=options) as api, api.client() as http:
        for host in ("h0", "h1"):
            body = {"hypervisor_uri": f"test:///{host}", "inventories": {"VCPU": {"total": 4}}}
            assert http.put(f"/hosts/{host}/agent", json=body).status_code in (200, 201)
        deadline = time.monotonic() + 60
        while http.get("/hosts/h0").json()["state"] != "down":
            assert time.monotonic() < deadline, "h0 was not fenced"
            said = {"running_vms": [], "launching": [], "seen_generation": 0}
            assert http.post("/hosts/h1/report", json=said).status_code == 200
            time.sleep(0.1)
        assert http.get("/hosts/h1").json()["state"] == "up"
    assert fenced.read_text().split() == ["h0"]


def test_serve_refuses_a_fence_command_it_cannot_run_and_a_threshold_liveness_cannot_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found out at start, not when a host dies; nothing is served (nor migrated)."""
    monkeypatch.chdir(tmp_path)
    for option in OPTIONS:  # serve hands its options to workers in the environment:
        monkeypatch.setenv(env_name(option), "")  # undone at the end, whatever serve set
        monkeypatch.delenv(env_name(option))
    db = f"sqlite:///{tmp_path / 'lm.db'}"
    missing = runner.invoke(app, ["serve", "--db", db, "--no-auth", "--fence-command", "nope-x"])
    assert missing.exit_code == 2
    assert "--fence-command: nope-x is not an executable file" in missing.output
    short = runner.invoke(app, ["serve", "--db", db, "--no-auth", "--agent-silent-after", "5"])
    assert short.exit_code == 2 and "at least 24" in short.output
    assert not (tmp_path / "lm.db").exists()


def test_serve_says_at_start_that_without_a_fence_command_no_host_is_fenced(
    tmp_path: Path,
) -> None:
    log = tmp_path / "serve.log"
    with ServedApi(f"sqlite:///{tmp_path / 'lm.db'}", 1, log):
        pass
    said = " ".join(log.read_text().split())
    assert "no fence command (--fence-command): a host whose agent falls silent" in said
    assert "never fenced" in said
