"""Running the agent on a real host, talking to the loadmaster API over HTTP."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from loadmaster.agent.hypervisor import Hypervisor
from loadmaster.agent.journal import AppliedJournal
from loadmaster.agent.libvirt_hv import GuestImage
from loadmaster.agent.loop import Agent, CycleReport
from loadmaster.agent.manager import HostManager, ManagerConfig
from loadmaster.agent.plugins import DEFAULT_DRIVER, DriverOptions, open_hypervisor
from loadmaster.errors import InvalidTransition
from loadmaster.microversions import CLIENT_HEADERS

log = logging.getLogger(__name__)
# The manager's long-poll of its work list: a change returns it at once, so this only
# bounds how long the agent takes to stop.
MANAGER_POLL_S = 5.0


class ApiClient:
    """The agent's calls to the loadmaster API. A 503 (the store away) is retried after the
    ``Retry-After`` the server sends, a few times; every call here is safe to repeat."""

    RETRIES_ON_503 = 3

    def __init__(self, api_url: str, token: str | None = None, timeout: float = 5.0) -> None:
        headers = dict(CLIENT_HEADERS)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(base_url=api_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for attempt in range(self.RETRIES_ON_503 + 1):
            try:
                response = self._client.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                raise ApiUnreachable(
                    f"cannot reach the loadmaster API at {self._client.base_url}: {exc}"
                ) from exc
            if response.status_code != 503 or attempt == self.RETRIES_ON_503:
                break
            time.sleep(_retry_after(response))
        if response.is_error:
            raise ApiError(method, path, response)
        return response

    def report(self, host_name: str, payload: dict[str, Any]) -> None:
        self._call("POST", f"/hosts/{host_name}/report", json=payload)

    def request_migration(self, vm_uuid: str, reason: str) -> None:
        try:
            self._call("POST", f"/vms/{vm_uuid}/migrate", json={"reason": reason})
        except ApiError as exc:
            # Already being moved (or stopping): the request is answered, not failed.
            if exc.code != InvalidTransition.code:
                raise

    def register(self, host: str, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self._call("PUT", f"/hosts/{host}/agent", json=body).json()
        return answer

    def work(self, host: str, after: int, wait: float) -> dict[str, Any]:
        answer: dict[str, Any] = self._call(
            "GET",
            f"/hosts/{host}/work",
            params={"after": after, "wait": wait},
            timeout=wait + self._client.timeout.read + 5 if self._client.timeout.read else None,
        ).json()
        return answer

    def up(self, vm: str, host: str) -> None:
        self._call("POST", f"/vms/{vm}/up", json={"host": host})

    def launch_failed(self, vm: str, host: str, reason: str) -> None:
        self._call("POST", f"/vms/{vm}/launch-failed", json={"host": host, "reason": reason})

    def migration_failed(self, vm: str, host: str, reason: str) -> None:
        self._call("POST", f"/vms/{vm}/migration-failed", json={"host": host, "reason": reason})


class ApiUnreachable(Exception):
    """The API did not answer at all (refused, timed out, name unknown)."""


class ApiError(Exception):
    """The API answered with an error: the message says what it refused and why, in
    the operator's terms where the cause is known."""

    def __init__(self, method: str, path: str, response: httpx.Response) -> None:
        self.status = response.status_code
        self.code = ""
        try:
            body = response.json()
            detail, self.code = body.get("detail", response.text), body.get("code", "")
        except (ValueError, AttributeError):
            detail = response.text
        parts = path.split("/")
        if self.status == 404 and len(parts) > 2 and parts[1] == "hosts":
            host = parts[2]
            message = (
                f"the loadmaster API does not know host {host!r} ({method} {path}: {detail}). "
                f"Register it: run the agent with --url so it registers itself, or "
                f"'loadmaster host create {host} -i VCPU=N -i MEMORY_MB=N'; or give "
                f"--host-name as the host is registered"
            )
        elif self.status in (401, 403):
            message = (
                f"the loadmaster API refused the agent's token ({method} {path}: {detail}); "
                f"an agent needs a token with role agent:<its host name> or admin"
            )
        else:
            message = f"{method} {path}: {self.status} {detail}"
        super().__init__(message)


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(30.0, max(0.1, float(response.headers.get("Retry-After", "1"))))
    except ValueError:
        return 1.0


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
    on_cycle: Callable[[CycleReport], None] | None = None,
    driver: str | None = None,
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
    destination's host name, as libvirt resolves it).
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
    stop = threading.Event()
    try:
        hypervisor = open_hypervisor(
            driver or config.driver or DEFAULT_DRIVER,
            DriverOptions(hypervisor_uri, sys_root, guest_image, migration_data_uri),
        )
        client = ApiClient(api_url, token, timeout=10.0) if api_url else None
        host_name = host_name or config.name or socket.gethostname()
        if client is not None:
            # A separate connection: the manager's long-polls must not hold up reports.
            manager_client = ApiClient(api_url or "", token, timeout=10.0)
            manager = HostManager(
                hypervisor,
                manager_client,
                config,
                host_name=host_name,
                hypervisor_uri=hypervisor_uri,
            )
            manager.register()
            manager_thread = threading.Thread(
                target=manager.run_forever,
                args=(stop,),
                kwargs={"wait": MANAGER_POLL_S},
                name="host-manager",
                daemon=True,
            )
            manager_thread.start()
        agent = Agent(
            hypervisor,
            policy_dir,
            interval,
            reporter=client.report if client else None,
            host_name=host_name,
            migration_sender=client.request_migration if client else None,
            journal=journal,
            report_context=manager.report_context if manager else None,
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
            return reports
        _stop_on_signals(stop)
        agent.run_forever(stop, on_cycle)
        return []
    finally:
        stop.set()
        # The manager's pass ends (its long-poll returns) before the connections it uses
        # close: else it would act, or hold a request open on the API, after we returned.
        if manager_thread is not None:
            manager_thread.join(timeout=MANAGER_POLL_S + 30.0)
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


def _stop_on_signals(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _signum, _frame: stop.set())
