"""A cloud in one process: the loadmaster API served over HTTP in a thread, and per
simulated host its agent, exactly as ``loadmaster agent --api`` runs it: the host manager
(long-polled work list: launch, migrate, remove) and the SLA policy loop (collect,
evaluate the shipped MOM-language policies, control, report), each over its own HTTP
connection with a token bound to its host. Only the hypervisor is simulated.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from sqlalchemy import select

from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.manager import HostManager, ManagerConfig
from loadmaster.agent.runner import ApiClient
from loadmaster.agent.sla import Agent
from loadmaster.agent.sla.simulated import simulated_agent
from loadmaster.api import AuthConfig, create_app
from loadmaster.api.server import ThreadedServer, serve_in_thread
from loadmaster.apiclient import ApiError
from loadmaster.errors import InvalidTransition
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.policy import shipped_policy_dir
from loadmaster.service import Loadmaster
from loadmaster.store.schema import HostAgentRow, HostRow

log = logging.getLogger(__name__)
ADMIN_TOKEN = "demo-admin"


def agent_token(host: str) -> str:
    return f"demo-agent-{host}"


@dataclass(frozen=True)
class MigrationRequest:
    """A migration a host's SLA policy asked for, and the server's answer: ``began``, or
    the code of the error that refused it (``loadmaster.invalid_transition``: the VM was
    already moving; ``loadmaster.no_valid_host``: no host could take it)."""

    vm: str
    host: str
    answer: str


@dataclass(frozen=True)
class HostPlan:
    name: str
    memory_gib: int = 64
    cpus: int = 32
    launch_delay: float = 0.0
    config: ManagerConfig = field(default_factory=ManagerConfig)
    # libvirt node-device descriptions of its devices (offered as its config says).
    node_devices: tuple[str, ...] = ()


@dataclass
class SimHost:
    """One simulated host and its agent's two loops."""

    name: str
    sim: SimulatedHypervisor
    manager: HostManager
    clients: list[ApiClient]
    sla: Agent | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    cycles: int = 0

    def start(self, cycle_s: float, report_s: float) -> None:
        self.threads = [
            threading.Thread(
                target=self.manager.run_forever,
                args=(self.stop,),
                kwargs={"wait": 1.0},
                name=f"{self.name}-manager",
                daemon=True,
            ),
            threading.Thread(
                target=self._sla_loop if self.sla else self._report_loop,
                args=(cycle_s if self.sla else report_s,),
                name=f"{self.name}-sla",
                daemon=True,
            ),
        ]
        for thread in self.threads:
            thread.start()

    def _sla_loop(self, cycle_s: float) -> None:
        """A cycle every ``cycle_s`` from the start of the last: waiting ``cycle_s`` after
        each cycle's work stretched every cycle by that work (0.1 s of 0.4 s on a loaded
        machine, and the demo's memory-pressure act is 45 cycles). A cycle that overran
        is followed at once, never by a burst to catch up."""
        assert self.sla is not None
        due = time.monotonic() + cycle_s
        while not self.stop.wait(max(0.0, due - time.monotonic())):
            due = max(due, time.monotonic()) + cycle_s
            self.sim.advance()
            self.sla.run_cycle()
            self.cycles += 1

    def _report_loop(self, every_s: float) -> None:
        while not self.stop.wait(every_s):
            try:
                self.manager.report()
            except Exception as exc:  # the API may be busy; the next report will do
                log.debug("report of %s failed: %s", self.name, exc)

    def kill(self) -> None:
        """As close to kill -9 as a thread gets: the agent stops talking to the API at once;
        what the hypervisor was already doing (a launch, a migration) still happens."""
        self.stop.set()
        for client in self.clients:
            client.close()
        self.join()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=10)

    def close(self) -> None:
        self.stop.set()
        self.join()
        self.manager.close()
        for client in self.clients:
            client.close()


class SimulatedCloud:
    """``add_host`` builds a simulated host, registers it through its agent and starts the
    agent. With ``sla`` each host's SLA loop advances simulated time one step per cycle
    (demand ramps up over ``ramp_cycles`` cycles); without, the host only reports."""

    def __init__(
        self,
        lm: Loadmaster,
        *,
        sla: bool = True,
        cycle_s: float = 0.25,
        report_s: float = 0.2,
        ramp_cycles: int = 60,
        agent_hosts: list[str] | None = None,
    ) -> None:
        self.lm = lm
        self.sla = sla
        self.cycle_s = cycle_s
        self.report_s = report_s
        self.ramp_cycles = ramp_cycles
        tokens = {ADMIN_TOKEN: "admin"}
        tokens.update({agent_token(h): f"agent:{h}" for h in agent_hosts or []})
        self._tokens = tokens
        self.server: ThreadedServer = serve_in_thread(create_app(lm, AuthConfig(tokens)))
        self.url = self.server.url
        self.admin = httpx.Client(
            base_url=self.url,
            headers={**CLIENT_HEADERS, "Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=60,
        )
        self.hosts: dict[str, SimHost] = {}
        self.sims: dict[str, SimulatedHypervisor] = {}
        self.migration_requests: list[MigrationRequest] = []

    def add_host(self, plan: HostPlan, *, start: bool = True) -> SimHost:
        if agent_token(plan.name) not in self._tokens:
            raise ValueError(f"host {plan.name} has no agent token; name it in agent_hosts")
        sim = self.sims.get(plan.name) or SimulatedHypervisor(
            [],
            host_memory_kib=plan.memory_gib * GIB,
            cpus=plan.cpus,
            hostname=plan.name,
            uri=f"sim://{plan.name}",
            ramp_steps=self.ramp_cycles,
            node_devices=plan.node_devices,
        )
        sim.launch_delay = plan.launch_delay
        self.sims[plan.name] = sim
        host = self.agent_for(plan)
        host.manager.register()
        if start:
            host.start(self.cycle_s, self.report_s)
        else:
            # The first read a manager makes when it starts; the caller drives the rest.
            host.manager.step()
        self.hosts[plan.name] = host
        self._until_listed(plan.name)
        return host

    def _until_listed(self, name: str, timeout: float = 60.0) -> None:
        """Until the host's manager holds its list as the server wrote it, so that the
        host takes VMs (``live_agent``) from the next placement on."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lm.store.read() as session:
                runs = session.execute(
                    select(HostAgentRow.agent_run, HostAgentRow.listed_run)
                    .join(HostRow, HostRow.id == HostAgentRow.host_id)
                    .where(HostRow.name == name)
                ).one_or_none()
            if runs is not None and runs[0] == runs[1]:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"host {name}: its manager read no work list in {timeout} s")
            time.sleep(0.02)
        # Written by the server in this process, which told its scheduler; said again in
        # case this read saw the commit before the server could.
        self.lm.scheduler.agents_changed()

    def agent_for(self, plan: HostPlan) -> SimHost:
        """A new agent for an existing simulated host (as after a restart)."""
        sim = self.sims[plan.name]
        token = agent_token(plan.name)
        # One run per agent, as each real agent is a process of its own: a new agent for
        # the host is a restart, which holds no work list until it reads one.
        run = uuid.uuid4().hex
        manager_client = ApiClient(self.url, token, timeout=30.0, run=run)
        manager = HostManager(
            sim,
            manager_client,
            plan.config,
            host_name=plan.name,
            hypervisor_uri=f"sim://{plan.name}",
            device_source=sim,
        )
        clients = [manager_client]
        sla = None
        if self.sla:
            sla_client = ApiClient(self.url, token, timeout=30.0, run=run)
            clients.append(sla_client)
            sla = simulated_agent(
                sim,
                shipped_policy_dir(),
                interval=sim.step_seconds,
                reporter=sla_client.report,
                host_name=plan.name,
                migration_sender=self._sender(sla_client, plan.name),
                report_context=manager.report_context,
                clock=sim.clock,
            )
        return SimHost(plan.name, sim, manager, clients, sla)

    def _sender(self, client: ApiClient, host: str) -> Callable[[str, str], None]:
        def send(vm: str, reason: str) -> None:
            try:
                began = client.request_migration(vm, reason)
            except ApiError as exc:
                self.migration_requests.append(MigrationRequest(vm, host, exc.code or exc.detail))
                raise
            answer = "began" if began else InvalidTransition.code
            self.migration_requests.append(MigrationRequest(vm, host, answer))

        return send

    def restart(self, name: str, plan: HostPlan | None = None) -> SimHost:
        host = self.agent_for(plan or HostPlan(name))
        host.manager.register()
        host.start(self.cycle_s, self.report_s)
        self.hosts[name] = host
        return host

    def where_running(self) -> dict[str, list[str]]:
        """Each guest's uuid -> the simulated hosts that run it (one, if all is well)."""
        found: dict[str, list[str]] = {}
        for name, sim in self.sims.items():
            for guest in sim.list_guests():
                found.setdefault(guest.uuid, []).append(name)
        return found

    def close(self) -> None:
        for host in self.hosts.values():
            host.stop.set()  # all at once: each may be in a long-poll
        for host in self.hosts.values():
            host.close()
        self.admin.close()
        self.server.stop()
