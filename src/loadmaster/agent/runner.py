"""Running the agent on a real host, talking to the loadmaster API over HTTP."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import httpx

from loadmaster.agent.journal import AppliedJournal
from loadmaster.agent.libvirt_hv import LibvirtHypervisor
from loadmaster.agent.loop import Agent, CycleReport

log = logging.getLogger(__name__)


class ApiClient:
    """The two calls the agent makes: host usage reports and migration requests."""

    def __init__(self, api_url: str, token: str | None = None, timeout: float = 5.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=api_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def report(self, host_name: str, payload: dict[str, Any]) -> None:
        self._client.post(f"/hosts/{host_name}/report", json=payload).raise_for_status()

    def request_migration(self, vm_uuid: str, reason: str) -> None:
        self._client.post(f"/vms/{vm_uuid}/migrate", json={"reason": reason}).raise_for_status()


def run_agent(
    hypervisor_uri: str,
    policy_dir: Path,
    interval: float,
    api_url: str | None,
    token: str | None,
    host_name: str | None,
    cycles: int | None,
    state_dir: Path | None = None,
    collectors: str | None = None,
) -> list[CycleReport]:
    """Run the agent against ``hypervisor_uri`` (e.g. ``qemu:///system``, ``test:///default``).

    Without ``api_url`` nothing is reported and migration requests are not sent. With
    ``cycles`` it runs that many cycles, ``interval`` apart, and returns their reports;
    otherwise it runs until SIGINT or SIGTERM and returns the empty list. With
    ``state_dir`` every applied control is journalled there (``AppliedJournal``).
    Raises ``PolicyError`` when the policy directory does not load, ``HypervisorError``
    when the hypervisor cannot be reached, ``JournalError`` when the state directory
    cannot be used. ``collectors`` names the collector set (``vdsm``, ``mom-libvirt``;
    default ``loadmaster``); an unknown name raises ``ValueError``.
    """
    journal = AppliedJournal(state_dir) if state_dir is not None else None
    last = journal.state_at_open.open_cycle if journal is not None else None
    if last is not None:
        log.warning(
            "the previous agent stopped in cycle %d after %d journalled action(s); the "
            "hypervisor may be one call ahead of the journal, its values are used",
            last.cycle,
            last.applied,
        )
    hypervisor: LibvirtHypervisor | None = None
    client: ApiClient | None = None
    try:
        hypervisor = LibvirtHypervisor(hypervisor_uri)
        client = ApiClient(api_url, token) if api_url else None
        agent = Agent(
            hypervisor,
            policy_dir,
            interval,
            reporter=client.report if client else None,
            host_name=host_name or socket.gethostname(),
            migration_sender=client.request_migration if client else None,
            journal=journal,
            collectors=collectors,
        )
        stop = threading.Event()
        if cycles is not None:
            reports = []
            for i in range(cycles):
                reports.append(agent.run_cycle())
                if i + 1 < cycles and stop.wait(interval):
                    break
            return reports
        _stop_on_signals(stop)
        agent.run_forever(stop)
        return []
    finally:
        if client is not None:
            client.close()
        if hypervisor is not None:
            hypervisor.close()
        if journal is not None:
            journal.close()


def _stop_on_signals(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _signum, _frame: stop.set())
