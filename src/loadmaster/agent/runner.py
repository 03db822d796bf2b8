"""Running the agent on a real host, talking to the loadmaster API over HTTP."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadmaster.agent.hypervisor.base import GuestImage, Hypervisor
from loadmaster.agent.hypervisor.devices import LibvirtDevices
from loadmaster.agent.hypervisor.registry import DEFAULT_DRIVER, DriverOptions, open_hypervisor
from loadmaster.agent.hypervisor.storage import StorageConfig
from loadmaster.agent.manager.host_manager import HostManager, ManagerConfig
from loadmaster.agent.sla.journal import AppliedJournal
from loadmaster.agent.sla.loop import Agent, CycleReport
from loadmaster.agent.sla.reporting import MeasurementReporter
from loadmaster.apiclient import ApiClient as HttpClient
from loadmaster.apiclient import ApiError, ClientTls
from loadmaster.errors import InvalidTransition
from loadmaster.heartbeat import AGENT_HEADER, AGENT_RUN_HEADER

log = logging.getLogger(__name__)

# This process's run, said with each of its hosts' registrations, reports and reads of
# work lists (``heartbeat.AGENT_RUN_HEADER``): the server learns that the host's manager
# restarted, and holds no list until it reads one.
RUN = uuid.uuid4().hex


class ApiClient(HttpClient):
    """The agent's calls to the loadmaster API (``loadmaster.apiclient``); every call here
    is safe to repeat, so a 503 is retried after the server's ``Retry-After``."""

    def __init__(
        self,
        api_url: str,
        token: str | None = None,
        timeout: float = 5.0,
        tls: ClientTls | None = None,
        run: str | None = None,
    ) -> None:
        """``run``: the run said (``AGENT_RUN_HEADER``), by default this process's; the
        clients of one agent say the same."""
        super().__init__(api_url, token, timeout, tls)
        self.run = run or RUN

    def hint(self, method: str, path: str, status: int) -> str:
        parts = path.split("/")
        if status == 404 and len(parts) > 2 and parts[1] == "hosts":
            host = parts[2]
            return (
                f"the loadmaster API does not know host {host!r}. Register it: run the agent "
                f"with --url so it registers itself, or 'loadmaster host create {host} "
                f"-i VCPU=N -i MEMORY_MB=N'; or give --host-name as the host is registered"
            )
        if status in (401, 403):
            return (
                "the loadmaster API refused the agent; an agent needs a token with role "
                "agent:<its host name> or admin, or a client certificate naming its host"
            )
        return ""

    def report(self, host_name: str, payload: dict[str, Any]) -> None:
        self.request(
            "POST", f"/hosts/{host_name}/report", body=payload, headers={AGENT_RUN_HEADER: self.run}
        )

    def request_migration(self, vm_uuid: str, reason: str) -> bool:
        """True: a migration began; False: the VM was already moving (or stopping)."""
        try:
            self.post(f"/vms/{vm_uuid}/migrate", {"reason": reason})
        except ApiError as exc:
            # Already being moved (or stopping): the request is answered, not failed.
            if exc.code != InvalidTransition.code:
                raise
            return False
        return True

    def register(self, host: str, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.request(
            "PUT", f"/hosts/{host}/agent", body=body, headers={AGENT_RUN_HEADER: self.run}
        )
        return answer

    def work(self, host: str, after: int, wait: float) -> dict[str, Any] | None:
        # None: the wait ended with generation ``after`` still current (304).
        answer: dict[str, Any] | None = self.request(
            "GET",
            f"/hosts/{host}/work",
            params={"after": after, "wait": wait},
            timeout=wait + self.timeout + 5,
            # Only the host's own agent's polls keep the host live (an admin's would too
            # if the header were not there: heartbeat.polls_as_agent).
            headers={
                AGENT_HEADER: host,
                AGENT_RUN_HEADER: self.run,
                **({"If-None-Match": f'"{after}"'} if after >= 0 else {}),
            },
        )
        return answer

    def up(self, vm: str, host: str, devices: list[dict[str, Any]] | None = None) -> None:
        body: dict[str, Any] = {"host": host}
        if devices is not None:
            body["devices"] = devices
        self.post(f"/vms/{vm}/up", body)

    def launch_failed(self, vm: str, host: str, reason: str) -> None:
        self.post(f"/vms/{vm}/launch-failed", {"host": host, "reason": reason})

    def migration_failed(self, vm: str, host: str, reason: str) -> None:
        self.post(f"/vms/{vm}/migration-failed", {"host": host, "reason": reason})


def run_agent(
    hypervisor_uri: str,
    policy_dir: Path,
    interval: float,
    api_url: str | None,
    token: str | None,
    host_name: str | None,
    cycles: int | None,
    state_dir: Path | None = None,
    sys_root: Path | None = None,
    config_file: Path | None = None,
    collectors: str | None = None,
    guest_image: GuestImage | None = None,
    migration_data_uri: str | None = None,
    storage: StorageConfig | None = None,
    on_cycle: Callable[[CycleReport], None] | None = None,
    driver: str | None = None,
    tls: ClientTls | None = None,
) -> list[CycleReport]:
    """Run the agent against ``hypervisor_uri`` (e.g. ``qemu:///system``, ``test:///default``)
    through the hypervisor ``driver`` (an entry of ``loadmaster.hypervisors``; default the
    config file's ``host.driver``, else ``libvirt``).

    Without ``api_url`` nothing is reported and migration requests are not sent. With
    ``cycles`` it runs that many cycles, ``interval`` apart, and returns their reports;
    otherwise it runs until SIGINT or SIGTERM and returns the empty list. With
    ``state_dir`` every applied control is journalled there (``AppliedJournal``). KSM is
    written under ``sys_root``; without it, the machine's /sys for a real driver and
    memory for the test driver (``ksm_for``).
    With ``api_url`` the agent is also the host's manager (``HostManager``): it registers
    the host with the inventory it discovers (plus ``config_file``, see ``ManagerConfig``)
    and launches, moves and removes guests as the ledger says, in a thread of its own.
    Raises ``PolicyError`` when the policy directory does not load, ``HypervisorError``
    when the hypervisor cannot be reached, ``JournalError`` when the state directory
    cannot be used, ``ValidationError`` for a bad config file.
    ``collectors`` names the collector set (``vdsm``, ``mom-libvirt``;
    default ``loadmaster``); an unknown name raises ``ValueError``.
    On QEMU the manager launches guests from ``guest_image`` (without one a launch fails
    and the VM is placed elsewhere), and ``migration_data_uri`` (``tcp://ADDRESS``) is where
    the destination's QEMU listens for a live migration's data (default: the
    destination's host name, as libvirt resolves it). ``storage`` says where guests'
    disks (a libvirt storage pool) and base images are (default: ``StorageConfig()``).
    ``tls``: the CA an ``https://`` API is verified against, and the client certificate
    that may stand for ``token``; a file of it that cannot be used raises ``TlsSetupError``.
    """
    config = ManagerConfig.from_file(config_file) if config_file else ManagerConfig()
    journal = AppliedJournal(state_dir) if state_dir is not None else None
    last = journal.state_at_open.open_cycle if journal is not None else None
    if last is not None:
        log.warning(
            "the previous agent stopped in cycle %d after %d journalled action(s); the "
            "hypervisor may be one call ahead of the journal, its values are used",
            last.cycle,
            last.applied,
        )
    hypervisor: Hypervisor | None = None
    client: ApiClient | None = None
    manager: HostManager | None = None
    manager_client: ApiClient | None = None
    manager_thread: threading.Thread | None = None
    agent: Agent | None = None
    stop = threading.Event()
    # What ended the run ("on SIGTERM "), for its last log line; None until it ends cleanly.
    ended: str | None = None
    try:
        hypervisor = open_hypervisor(
            driver or config.driver or DEFAULT_DRIVER,
            DriverOptions(hypervisor_uri, sys_root, guest_image, migration_data_uri, storage),
        )
        client = ApiClient(api_url, token, timeout=10.0, tls=tls) if api_url else None
        host_name = host_name or config.name or socket.gethostname()
        log.info(
            "agent of host %s starting: hypervisor %s, policy %s, a cycle every %g s, %s",
            host_name,
            hypervisor_uri,
            policy_dir,
            interval,
            f"API {api_url}" if api_url else "no API (SLA policy only)",
        )
        if client is not None:
            # A separate connection: the manager's long-polls must not hold up reports.
            manager_client = ApiClient(api_url or "", token, timeout=10.0, tls=tls)
            manager = HostManager(
                hypervisor,
                manager_client,
                config,
                host_name=host_name,
                hypervisor_uri=hypervisor_uri,
                device_source=LibvirtDevices(hypervisor_uri),
            )
            manager.register()
            manager_thread = threading.Thread(
                target=manager.run_forever,
                args=(stop,),
                name="host-manager",
                daemon=True,
            )
            manager_thread.start()
        agent = Agent(
            hypervisor,
            policy_dir,
            interval,
            reporter=MeasurementReporter(client.report) if client else None,
            host_name=host_name,
            migration_sender=client.request_migration if client else None,
            journal=journal,
            collectors=collectors,
        )
        if cycles is not None:
            reports = []
            for i in range(cycles):
                reports.append(agent.run_cycle())
                if on_cycle is not None:
                    on_cycle(reports[-1])
                if i + 1 < cycles and stop.wait(interval):
                    break
            ended = ""
            return reports
        signals = _stop_on_signals(stop)
        agent.run_forever(stop, on_cycle)
        ended = f"on {signals[-1]} " if signals else ""
        return []
    finally:
        stop.set()
        # The manager's pass ends before the connections it uses close: else it would act,
        # or hold a request open on the API, after we returned. A long-poll it is waiting
        # in is cut off (closing its client), not waited for.
        if manager_thread is not None:
            manager_thread.join(timeout=1.0)
            if manager_thread.is_alive() and manager_client is not None:
                manager_client.close()
            manager_thread.join(timeout=30.0)
        if manager is not None:
            manager.close()
        if manager_client is not None:
            manager_client.close()
        if client is not None:
            client.close()
        # A driver that holds no connection has nothing to close.
        close = getattr(hypervisor, "close", None)
        if close is not None:
            close()
        if journal is not None:
            journal.close()
        if ended is not None and agent is not None:
            log.info("agent of host %s stopped %safter %d cycles", host_name, ended, agent.cycles)


def _stop_on_signals(stop: threading.Event) -> list[str]:
    """Have SIGINT and SIGTERM set ``stop``; the list returned gets each one's name."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        return received

    def handle(signum: int, _frame: object) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)
    return received
