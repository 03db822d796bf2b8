"""A small cloud for host-manager tests: a live API over HTTP and, per host, a simulated
hypervisor with its agent's manager (bound to its own token), run in threads."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

import loadmaster
from loadmaster.agent.manager import HostManager, ManagerConfig
from loadmaster.agent.runner import ApiClient
from loadmaster.agent.simulator import GIB, SimulatedHypervisor
from loadmaster.api import AuthConfig, create_app
from loadmaster.cluster import VmSpec
from loadmaster.pending import audit
from loadmaster.service import Loadmaster

ADMIN = "admin-token-4d2a"


def _serve(app: object) -> tuple[uvicorn.Server, threading.Thread, str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the API did not start"
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{port}"


def agent_token(host: str) -> str:
    return f"agent-{host}-token"


@dataclass
class Host:
    name: str
    sim: SimulatedHypervisor
    manager: HostManager
    client: ApiClient
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, report_every: float = 0.2) -> None:
        """The manager's loop, and reports as often as ``report_every`` (reports racing
        launches are what a claim must survive)."""

        def reports() -> None:
            while not self.stop.wait(report_every):
                try:
                    self.manager.report()
                except Exception:  # the API may be busy; the next report will do
                    continue

        self.threads = [
            threading.Thread(
                target=self.manager.run_forever, args=(self.stop,), kwargs={"wait": 2.0}
            ),
            threading.Thread(target=reports),
        ]
        for thread in self.threads:
            thread.start()

    def kill(self) -> None:
        """As close to kill -9 as a thread gets: the agent stops talking to the API at once;
        what the hypervisor was already doing (a launch, a migration) still happens."""
        self.stop.set()
        self.client.close()
        for thread in self.threads:
            thread.join(timeout=10)

    def halt(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)
        self.manager.close()


@dataclass
class Cloud:
    url: str
    lm: Loadmaster
    admin: httpx.Client
    hosts: dict[str, Host]
    sims: dict[str, SimulatedHypervisor]

    def add_host(
        self,
        name: str,
        *,
        memory_gib: int = 64,
        cpus: int = 32,
        config: ManagerConfig | None = None,
        launch_delay: float = 0.0,
        start: bool = True,
    ) -> Host:
        sim = self.sims.get(name) or SimulatedHypervisor(
            [], host_memory_kib=memory_gib * GIB, cpus=cpus, hostname=name, uri=f"sim://{name}"
        )
        sim.launch_delay = launch_delay
        self.sims[name] = sim
        host = self.manager_for(name, config)
        host.manager.register()
        if start:
            host.start()
        self.hosts[name] = host
        return host

    def manager_for(self, name: str, config: ManagerConfig | None = None) -> Host:
        client = ApiClient(self.url, agent_token(name), timeout=30.0)
        manager = HostManager(
            self.sims[name],
            client,
            config or ManagerConfig(),
            host_name=name,
            hypervisor_uri=f"sim://{name}",
        )
        return Host(name, self.sims[name], manager, client)

    def create_vms(self, count: int, flavor: str = "small", **fields: Any) -> list[str]:
        """Created in one go in-process: the subject is what agents do with them."""
        first = len(self.lm.vms.list())
        specs = [VmSpec(f"{flavor}-{first + i}", flavor, **fields) for i in range(count)]
        return [vm.uuid for vm in self.lm.vms.create_many(specs)]

    def schedule(self, uuids: list[str]) -> dict[str, Any]:
        response = self.admin.post("/schedule", json={"requests": [{"vms": uuids}]})
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def where_running(self) -> dict[str, list[str]]:
        """Each guest's uuid -> the simulated hosts that run it (one, if all is well)."""
        found: dict[str, list[str]] = {}
        for name, sim in self.sims.items():
            for guest in sim.list_guests():
                found.setdefault(guest.uuid, []).append(name)
        return found

    def wait_for(
        self, condition: Callable[[], bool], timeout: float = 60.0, what: str = ""
    ) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for vm in self.lm.vms.list():
            counts[vm.state] = counts.get(vm.state, 0) + 1
        return counts

    def assert_consistent(self) -> None:
        assert audit(self.lm.store) == []
        running = self.where_running()
        assert all(len(hosts) == 1 for hosts in running.values()), running
        for vm in self.lm.vms.list():
            if vm.state == "running":
                assert running.get(vm.uuid) == [vm.host], (vm.uuid, vm.host, running.get(vm.uuid))


@contextmanager
def cloud(db_url: str, host_names: list[str]) -> Iterator[Cloud]:
    lm = loadmaster.open(db_url)
    tokens = {ADMIN: "admin", **{agent_token(h): f"agent:{h}" for h in host_names}}
    server, thread, url = _serve(create_app(lm, AuthConfig(tokens)))
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    made = Cloud(url, lm, admin, {}, {})
    body = {"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 1024}}
    assert admin.post("/flavors", json=body).status_code == 201
    try:
        yield made
    finally:
        for host in made.hosts.values():
            host.stop.set()  # all at once: each may be in a long-poll of up to 2 s
        for host in made.hosts.values():
            host.halt()
        admin.close()
        server.should_exit = True
        thread.join(timeout=10)
        lm.close()
