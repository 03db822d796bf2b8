"""The operator's guide's set-up: two real ``loadmaster agent`` processes on libvirt's
test driver (``test:///default``), a test host private to each agent's process. No guest
can move between them, and nothing may pretend it did: a migration ends failed, with the
reason, the VM still running at its source; never ``stopped`` and reported done."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import ADMIN, LOADMASTER
from tests.api.api_helpers import run_server
from typer.testing import CliRunner

import loadmaster
from loadmaster.api import AuthConfig, create_app
from loadmaster.cli import app
from loadmaster.cluster.records import VmRecord
from loadmaster.service import Loadmaster

HOSTS = ("node-1", "node-2")
WAIT_S = 120.0
runner = CliRunner()


@dataclass
class Fleet:
    url: str
    lm: Loadmaster
    agents: dict[str, subprocess.Popen[bytes]]
    logs: dict[str, Path]

    def cli(self, *args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["--url", self.url, "--token", ADMIN, *args])
        return result.exit_code, result.output

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not condition():
            for name, agent in self.agents.items():
                assert agent.poll() is None, f"agent {name} exited: {self.logs[name].read_text()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def vm(self, name: str) -> VmRecord:
        (found,) = (v for v in self.lm.vms.list() if v.name == name)
        return found


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'lm.db'}")
    tokens = {ADMIN: "admin", **{f"{h}-secret": f"agent:{h}" for h in HOSTS}}
    server, thread, url = run_server(create_app(lm, AuthConfig(tokens)))
    policy_dir = tmp_path / "policies"  # no policy: the host manager is the subject
    policy_dir.mkdir()
    agents: dict[str, subprocess.Popen[bytes]] = {}
    logs = {h: tmp_path / f"{h}.log" for h in HOSTS}
    try:
        for host in HOSTS:
            with logs[host].open("wb") as out:
                agents[host] = subprocess.Popen(
                    [
                        LOADMASTER,
                        "agent",
                        "--hypervisor",
                        "test:///default",
                        "--policy-dir",
                        str(policy_dir),
                        "--url",
                        url,
                        "--token",
                        f"{host}-secret",
                        "--host-name",
                        host,
                        "--interval",
                        "1",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
        yield Fleet(url, lm, agents, logs)
    finally:
        for agent in agents.values():
            agent.kill()
            agent.wait()
        server.should_exit = True
        thread.join(timeout=10)
        lm.close()


def test_no_migration_between_per_process_test_drivers_ends_stopped_and_done(
    fleet: Fleet,
) -> None:
    f = fleet
    f.wait_for(
        lambda: (
            all(f.lm.host_agents.status(h).status == "ok" for h in HOSTS)
            if {h.name for h in f.lm.hosts.list()} >= set(HOSTS)
            else False
        ),
        "both agents registered",
    )
    assert f.cli("flavor", "create", "small", "-r", "VCPU=1", "-r", "MEMORY_MB=256")[0] == 0
    for name, extra in (("db-1", ()), ("web-1", ("--tag", "ha"))):
        code, output = f.cli("vm", "create", name, "-f", "small", *extra)
        assert code == 0, output
        code, output = f.cli("vm", "start", name, "--host", "node-1")
        assert code == 0, output
    f.wait_for(
        lambda: all(f.vm(n).state == "running" for n in ("db-1", "web-1")), "both VMs running"
    )

    code, output = f.cli("vm", "migrate", "db-1", "--host", "node-2")
    assert code == 0, output
    seen: list[str] = []

    def migration_over() -> bool:
        vm = f.vm("db-1")
        seen.append(vm.state)
        return vm.state != "migrating"

    f.wait_for(migration_over, "the migration of db-1 to end")
    vm = f.vm("db-1")
    assert "stopped" not in seen
    assert (vm.state, vm.host) == ("running", "node-1"), seen
    assert vm.fault is not None and "test driver" in vm.fault, vm.fault
    assert "node-2" in vm.fault

    # The drain: each migration fails the same way; the command says so and exits 4,
    # never "2 of 2 migrations done".
    code, output = f.cli("host", "drain", "node-1", "--wait", "--interval", "0.2")
    assert code == 4, output
    assert "2 of 2 migrations done" not in output
    assert "0 of 2 migrations done" in output, output
    assert "did not move" in output and "test driver" in output, output
    for name in ("db-1", "web-1"):
        vm = f.vm(name)
        assert (vm.state, vm.host) == ("running", "node-1"), (name, vm)
