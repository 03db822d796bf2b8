"""``loadmaster host evacuate HOST --confirm-down``: refused with what to do until the host
is known down, then the VMs by name with their new hosts (highly available first), what
fits nowhere, and the exit codes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import ADMIN
from tests.api.api_helpers import run_server
from typer.testing import CliRunner

import loadmaster
from loadmaster.api import AuthConfig, create_app
from loadmaster.cli import app
from loadmaster.service import Loadmaster

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
    assert code == 3 and "nosuch" in output and "(host)" in output
