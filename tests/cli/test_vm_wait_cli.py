"""``vm start --wait`` and ``vm create --start --wait``: exit 0 once the VM runs, 4 with
the hosts' reason once its launch is given up; a refused launch placed again on another
host is waited through, not taken for the end."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import ADMIN
from tests.api.api_helpers import run_server
from typer.testing import CliRunner

import loadmaster
from loadmaster.api import AuthConfig, create_app
from loadmaster.cli import app
from loadmaster.service import Loadmaster

runner = CliRunner()
WAIT_S = 120.0
NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}


class VmReads:
    """ASGI middleware: counts the answers to ``GET /vms/{uuid}``, and lets a test wait
    for the next ones."""

    def __init__(self, app: Any, counter: Counter) -> None:
        self.app, self.counter = app, counter

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
        path = scope.get("path", "")
        one_vm = path.startswith("/vms/") and path.count("/") == 2
        if scope["type"] == "http" and scope["method"] == "GET" and one_vm:
            self.counter.add()


@dataclass
class Counter:
    count: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    def add(self) -> None:
        with self.changed:
            self.count += 1
            self.changed.notify_all()

    def wait_beyond(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.count > count, timeout=WAIT_S)


@dataclass
class Served:
    url: str
    lm: Loadmaster
    reads: Counter

    def cli(self, *args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["--url", self.url, "--token", ADMIN, *args])
        return result.exit_code, result.output


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'wait.db'}")
    for host in ("h0", "h1"):
        lm.host_agents.register(host, hypervisor_uri=f"test+unix:///{host}", inventories=NODE)
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    reads = Counter()
    api = create_app(lm, AuthConfig({ADMIN: "admin"}))
    api.add_middleware(VmReads, counter=reads)
    server, thread, url = run_server(api)
    try:
        yield Served(url, lm, reads)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        lm.close()


def agents(lm: Loadmaster, stop: threading.Event, act: Callable[[str, str], None]) -> None:
    """The hosts' agents: ``act(vm, host)`` on each VM pending on a host."""
    while not stop.wait(0.02):
        for vm in lm.vms.list(state="pending"):
            if vm.host is not None:
                act(vm.uuid, vm.host)


def run_with_agents(s: Served, act: Callable[[str, str], None], *args: str) -> tuple[int, str]:
    stop = threading.Event()
    thread = threading.Thread(target=agents, args=(s.lm, stop, act))
    thread.start()
    try:
        return s.cli(*args)
    finally:
        stop.set()
        thread.join()


def test_a_launch_every_host_refuses_exits_4_with_their_reason(served: Served) -> None:
    s = served

    def refuse(vm: str, host: str) -> None:
        s.lm.host_agents.launch_failed(vm, host, f"host {host} has no /dev/kvm")

    code, output = run_with_agents(
        s, refuse, "vm", "create", "web-1", "-f", "small", "--start", "--wait", "--interval", "0.05"
    )
    assert code == 4, output
    assert "VM web-1 is requested, not running" in output
    assert "has no /dev/kvm" in output and "no other host fits" in output
    code, output = run_with_agents(
        s, refuse, "vm", "start", "web-1", "--wait", "--interval", "0.05"
    )
    assert code == 4, output
    assert "has no /dev/kvm" in output
    vm = s.lm.vms.list(name="web-1")[0]
    assert vm.state == "requested"

    def launch(vm: str, host: str) -> None:
        s.lm.allocations.activate(vm, host)

    code, output = run_with_agents(
        s, launch, "vm", "start", "web-1", "--wait", "--interval", "0.05"
    )
    assert code == 0, output
    assert "running" in output
    assert s.lm.vms.list(name="web-1")[0].state == "running"


def test_a_launch_placed_again_after_a_refusal_is_waited_through(served: Served) -> None:
    """While a refused VM is requested again (before the server places it elsewhere),
    --wait keeps waiting: here that moment is held until --wait has looked twice."""
    s = served
    code, output = s.cli("vm", "create", "db-1", "-f", "small")
    assert code == 0, output
    uuid = s.lm.vms.list(name="db-1")[0].uuid
    done: list[tuple[int, str]] = []
    waiter = threading.Thread(
        target=lambda: done.append(
            s.cli("vm", "start", "db-1", "--host", "h0", "--wait", "--interval", "0.01")
        )
    )
    waiter.start()
    try:
        first = s.reads.count
        s.reads.wait_beyond(first)  # --wait saw it pending on h0
        s.lm.allocations.fail(uuid, "h0", "host h0 has no /dev/kvm")
        assert s.lm.vms.get(uuid).tried_hosts == ("h0",)
        seen = s.reads.count
        s.reads.wait_beyond(seen + 1)  # and then requested, on its way elsewhere
        s.lm.allocations.claim(uuid, "h1")
        s.lm.allocations.activate(uuid, "h1")
    finally:
        waiter.join(timeout=WAIT_S)
    [(code, output)] = done
    assert code == 0, output
    assert "running" in output


def test_wait_needs_a_start_and_sane_times(served: Served) -> None:
    s = served
    code, output = s.cli("vm", "create", "x", "-f", "small", "--wait")
    assert code == 2 and "--start" in output
    code, output = s.cli("vm", "create", "x", "-f", "small", "--start", "--wait", "--timeout", "-1")
    assert code == 2 and "--timeout" in output
    assert s.lm.vms.list(name="x") == []
