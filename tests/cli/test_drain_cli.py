"""``loadmaster host drain``: the result for people and for scripts, ``--wait`` following
the migrations the host agents carry out, ``--force``, and the exit codes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from cli_helpers import ADMIN, READER
from sqlalchemy import select
from tests.api.api_helpers import run_server
from typer.testing import CliRunner

import loadmaster
from loadmaster.api import AuthConfig, create_app
from loadmaster.cli import app
from loadmaster.cli.remote import hosts as hosts_cli
from loadmaster.service import Loadmaster
from loadmaster.store.locking import now
from loadmaster.store.schema import HostAgentRow, HostRow

runner = CliRunner()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Loadmaster]]:
    """An API over a fresh SQLite database: h0 runs three small VMs and one big one that
    fits on no other host."""
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'drain.db'}")
    for name, vcpu in (("h0", 16), ("h1", 8), ("h2", 8)):
        lm.hosts.create(name, inventories={"VCPU": {"total": vcpu}, "MEMORY_MB": {"total": 32768}})
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    lm.flavors.create({"name": "big", "resources": {"VCPU": 12, "MEMORY_MB": 1024}})
    for name, flavor in (("s0", "small"), ("s1", "small"), ("s2", "small"), ("huge", "big")):
        vm = lm.vms.create(name, flavor).uuid
        lm.allocations.claim(vm, "h0")
        lm.allocations.activate(vm)
    server, thread, url = run_server(create_app(lm, AuthConfig({ADMIN: "admin", READER: "reader"})))
    try:
        yield url, lm
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        lm.close()


def cli(url: str, *args: str, token: str = ADMIN) -> tuple[int, str]:
    result = runner.invoke(app, ["--url", url, "--token", token, *args])
    return result.exit_code, result.output


def agents(lm: Loadmaster, stop: threading.Event) -> None:
    """The host agents: each migration completes a little after it was asked for."""
    while not stop.is_set():
        for vm in lm.vms.list(state="migrating"):
            time.sleep(0.1)
            lm.allocations.activate(vm.uuid)
        time.sleep(0.05)


def test_drain_waits_for_the_agents_and_lists_what_fits_nowhere(
    served: tuple[str, Loadmaster],
) -> None:
    url, lm = served
    huge = lm.vms.list(host="h0")[-1]
    assert huge.name == "huge"
    code, output = cli(url, "host", "drain", "h0", token=READER)
    assert code == 1 and "may only read" in output
    assert lm.hosts.get("h0").state == "up"  # the refused drain changed nothing

    stop = threading.Event()
    thread = threading.Thread(target=agents, args=(lm, stop))
    thread.start()
    try:
        code, output = cli(url, "host", "drain", "h0", "--wait", "--interval", "0.1")
    finally:
        stop.set()
        thread.join()
    assert code == 4, output  # a VM is left: the host is not empty
    assert "3 VMs placed elsewhere" in output
    assert "VM huge fits nowhere" in output and "no host fits" in output  # named, not a uuid
    assert all(f"│ {v.name} " in output for v in lm.vms.list() if v.name.startswith("s"))
    assert "resources" in output  # the filter that ruled the hosts out
    assert "host h0 is draining: 1 VMs left, 0 migrating" in output
    assert "migrations done" in output  # the progress bar
    assert {v.host for v in lm.vms.list(state="running") if v.name.startswith("s")} <= {"h1", "h2"}

    code, output = cli(url, "host", "drain", "h0", "--force", "--json")
    assert code == 0, output
    data = json.loads(output)
    assert data["stopped"] == [huge.uuid] and data["status"] == "maintenance"
    assert data["names"][huge.uuid] == "huge"
    assert data["unplaced"][0]["explanation"]["candidates"] == 0
    assert lm.vms.get(huge.uuid).state == "stopped"


def test_drain_json_and_bad_input(served: tuple[str, Loadmaster]) -> None:
    url, lm = served
    code, output = cli(url, "host", "drain", "nosuch")
    assert code == 3 and "host 'nosuch': no such host" in output
    code, output = cli(url, "host", "drain", "h0", "--timeout", "-1")
    assert code == 2
    assert lm.hosts.get("h0").state == "up"
    code, output = cli(url, "host", "drain", "h0", "--json", "--wait", "--timeout", "0")
    assert code == 4
    data = json.loads(output)  # nothing but JSON on stdout, even with --wait
    assert len(data["moved"]) == 3 and data["final"]["migrating"] == 3
    assert data["final"]["status"] == "draining"


def _with_agents(lm: Loadmaster, silent: str) -> None:
    """Every host gets an agent (same inventories); ``silent``'s last word is an hour old."""
    for host in lm.hosts.list():
        inventories = {k: v.as_dict() for k, v in host.inventories.items()}
        lm.host_agents.register(host.name, hypervisor_uri="test:///x", inventories=inventories)
    with lm.store.write() as session:
        row = session.scalars(select(HostRow).where(HostRow.name == silent)).one()
        agent = session.get(HostAgentRow, row.id)
        assert agent is not None
        agent.last_seen_at = now() - timedelta(hours=1)


def test_drain_from_a_silent_host_says_so_and_what_to_do(
    served: tuple[str, Loadmaster], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, lm = served
    _with_agents(lm, silent="h0")
    code, output = cli(url, "host", "drain", "h0")
    assert code == 4, output
    assert "the agent of host h0 is silent since" in output, output
    assert "loadmaster host evacuate h0 --confirm-down" in output

    # --wait prints a line at least every PROGRESS_EVERY seconds while nothing moves.
    monkeypatch.setattr(hosts_cli, "PROGRESS_EVERY", 0.2)
    code, output = cli(url, "host", "drain", "h0", "--wait", "--timeout", "2", "--interval", "0.1")
    assert code == 4, output
    progress = [line for line in output.splitlines() if line.startswith("draining h0: ")]
    assert len(progress) >= 3, output
    assert "under way" in progress[-1]
    assert output.count("the agent of host h0 is silent since") == 1, output


def test_claims_waiting_on_a_silent_host_are_shown_not_ended(
    served: tuple[str, Loadmaster],
) -> None:
    url, lm = served
    _with_agents(lm, silent="h2")
    waiting = lm.vms.create("stuck", "small").uuid
    lm.allocations.claim(waiting, "h2")
    fresh = lm.vms.create("fresh", "small").uuid
    lm.allocations.claim(fresh, "h1")
    lm.waiting.warn_after = timedelta(0)
    warning = "VM stuck has been pending on host h2 since "
    for command in (("vm", "list"), ("host", "show", "h2"), ("audit",)):
        code, output = cli(url, *command)
        assert code == 0, output
        assert warning in output and "the agent of host h2 is silent since" in output, command
        assert "fresh" not in output.split("warning:", 1)[1], command
    listed = json.loads(cli(url, "vm", "list", "--json")[1])
    assert len(listed["warnings"]) == 1 and warning in listed["warnings"][0]
    assert "no problems found" in cli(url, "audit")[1]
    lm.waiting.warn_after = timedelta(hours=1)
    assert "warning" not in cli(url, "vm", "list")[1]
    assert lm.vms.get(waiting).state == "pending"  # shown, never ended


def test_drain_wait_counts_only_migrations_that_arrived(served: tuple[str, Loadmaster]) -> None:
    """--wait counts a migration done once its VM runs on its destination, and one that
    ended otherwise failed, named with its fault; a VM placed again before it ever ran is
    no migration."""
    url, lm = served
    waiting = lm.vms.create("w0", "small").uuid
    lm.allocations.claim(waiting, "h0")  # claimed, never started: placed again, not moved
    rolled_back = lm.vms.list(host="h0")[0]
    assert rolled_back.name == "s0"

    def agents_failing_s0(stop: threading.Event) -> None:
        while not stop.is_set():
            for vm in lm.vms.list(state="migrating"):
                if vm.uuid == rolled_back.uuid:
                    lm.allocations.fail(vm.uuid, "h0", "the destination refused the move")
                else:
                    lm.allocations.activate(vm.uuid)
            time.sleep(0.05)

    stop = threading.Event()
    thread = threading.Thread(target=agents_failing_s0, args=(stop,))
    thread.start()
    try:
        code, output = cli(url, "host", "drain", "h0", "--wait", "--interval", "0.1")
    finally:
        stop.set()
        thread.join()
    assert code == 4, output
    assert "2 of 3 migrations done, 0 under way, 1 failed" in output, output
    assert "VM s0 did not move (running on h0): migration on h0 failed: the destination" in output
    assert lm.vms.get(waiting).state == "pending" and lm.vms.get(waiting).host != "h0"
