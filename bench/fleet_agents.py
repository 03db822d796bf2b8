"""Simulated host agents by the thousand, for bench/fleet.py and the fleet tests.

Each agent does over HTTP what the shipped agent's host manager does (``HostManager``):
it long-polls its work list, asking ``If-None-Match`` with the generation it holds, says
``up`` for every VM it is given to launch, and reports its VMs when they change and
differ from what its work list says (``manager.matches_work_list``). Every
wait is drawn from 80-100 % of ``wait``, and a failure backs off as the shipped agent
does (``manager.backoff``), after the server's ``Retry-After`` on 503 or 429. The
``legacy`` cadence is the one of the commit issue #24 starts from: a 5 s long-poll with no
``If-None-Match``, a full report after every pass, and the SLA loop's full report every
15 s. Otherwise each agent says a run of its own (``AGENT_RUN_HEADER``), as the shipped
one does, and with ``sla_every`` its SLA loop sends a measurement-only report (a load that
moved) that often.

HTTP/1.1 is spoken over asyncio streams directly: httpx's pool, with thousands of
connections in one process, spent more time on itself than on the server (300 waits of
3 s took up to 7 s through it, 3.1 s this way). Loopback only.

    python bench/fleet_agents.py --url URL --token T --hosts h0,h1,... --duration S
        [--wait 50] [--legacy] [--start-at MONOTONIC] [--spread 5] [--sla-every S]

prints one JSON object: requests by status, errors, wake-ups (VM uuid -> monotonic
time its agent read it), when each agent last completed a poll, the seconds from each
agent's start to its first work list, and the SLA reports' latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from loadmaster.agent.manager.host_manager import backoff, matches_work_list
from loadmaster.heartbeat import AGENT_HEADER, AGENT_RUN_HEADER

LEGACY_WAIT_S = 5.0
LEGACY_SLA_REPORT_S = 15.0


class HttpError(Exception):
    """No answer: the connection failed, closed or timed out."""


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Connection:
    """One keep-alive HTTP/1.1 connection, reopened after a failure."""

    def __init__(self, url: str, token: str | None) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        """Open the connection now, so that a caller can time a request without its connect."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, dict[str, str], bytes]:
        for reused in (self._writer is not None, False):
            try:
                return await asyncio.wait_for(self._exchange(method, path, body, headers), timeout)
            except (OSError, asyncio.IncompleteReadError) as exc:
                self.close()
                if reused:
                    continue  # the server closed the idle connection: open a new one
                raise HttpError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            except (TimeoutError, ValueError) as exc:
                self.close()
                raise HttpError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    async def _exchange(
        self, method: str, path: str, body: Any, headers: dict[str, str] | None
    ) -> tuple[int, dict[str, str], bytes]:
        await self.connect()
        # Held here: the agent's stop may close the connection (``close``) while this
        # exchange waits, which then ends in a reset, not in a reader gone from under it.
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        payload = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.auth}"
            "Accept: application/json\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
            + (
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                if body is not None
                else ""
            )
            + "\r\n"
        )
        writer.write(head.encode() + payload)
        status_line = await reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        answer: dict[str, str] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            answer[name.strip().lower()] = value.strip()
        length = int(answer.get("content-length", "0"))
        data = await reader.readexactly(length) if length else b""
        if answer.get("connection", "").lower() == "close":
            self.close()
        return status, answer, data

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


@dataclass
class FleetStats:
    statuses: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    # VM uuid -> when its agent read it on a work list (time.monotonic, system-wide).
    woken: dict[str, float] = field(default_factory=dict)
    # Host -> when its agent last completed a poll.
    polled: dict[str, float] = field(default_factory=dict)
    reports: int = 0
    # Host -> seconds from its agent's start to its first work list.
    first_list: dict[str, float] = field(default_factory=dict)
    # Each SLA report: when it was sent (time.monotonic, system-wide), and the
    # milliseconds it took to be answered.
    sla_ms: list[tuple[float, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "statuses": dict(self.statuses),
            "errors": dict(self.errors),
            "woken": self.woken,
            "polled": self.polled,
            "reports": self.reports,
            "first_list": self.first_list,
            "sla_ms": self.sla_ms,
        }


class SimAgent:
    def __init__(
        self,
        url: str,
        token: str | None,
        host: str,
        stats: FleetStats,
        *,
        wait: float,
        legacy: bool = False,
        sla_every: float = 0.0,
    ) -> None:
        self.host, self.stats, self.legacy = host, stats, legacy
        self.sla_every = sla_every
        self.run_id = uuid.uuid4().hex
        self.said = {} if legacy else {AGENT_RUN_HEADER: self.run_id}
        self.started = 0.0
        self.wait = LEGACY_WAIT_S if legacy else wait
        # A poll and the rest on connections of their own, as the shipped agent does.
        self.poll = Connection(url, token)
        self.calls = Connection(url, token)
        self.sla = Connection(url, token)  # the legacy SLA loop's own, as its client was
        self.seen = -1
        self.running: set[str] = set()
        self.reported: tuple[frozenset[str], int] | None = None
        self.items: list[dict[str, Any]] = []

    async def run(self, until: float) -> None:
        failures = 0
        self.started = time.monotonic()
        sla = (
            asyncio.create_task(self._legacy_sla(until))
            if self.legacy
            else asyncio.create_task(self._sla(until))
            if self.sla_every > 0
            else None
        )
        try:
            while time.monotonic() < until:
                try:
                    await self._pass(until)
                    failures = 0
                except HttpError as exc:
                    failures += 1
                    self._count(exc)
                    await asyncio.sleep(backoff(failures))
        finally:
            if sla is not None:
                sla.cancel()
            self.poll.close()
            self.calls.close()
            self.sla.close()

    def _count(self, exc: HttpError) -> None:
        """An error by route and kind, not by host: ten thousand hosts make one line each."""
        request, _, why = str(exc).partition(": ")
        route = UUID.sub("{vm}", request.split("?")[0]).replace(f"/{self.host}/", "/{host}/")
        self.stats.errors[f"{route}: {why.split(':')[0]}"] += 1

    async def _pass(self, until: float) -> None:
        wait = min(self.wait * random.uniform(0.8, 1.0), max(0.0, until - time.monotonic()))
        headers = {AGENT_HEADER: self.host, **self.said}
        if not self.legacy and self.seen >= 0:
            headers["If-None-Match"] = f'"{self.seen}"'
        status, answer, body = await self.poll.request(
            "GET",
            f"/hosts/{self.host}/work?after={self.seen}&wait={wait:.2f}",
            headers=headers,
            timeout=wait + 30,
        )
        self.stats.statuses[f"work {status}"] += 1
        if status in (429, 503):
            pause = float(answer.get("retry-after", "1")) * random.uniform(1, 1.5)
            await asyncio.sleep(min(pause, max(0.0, until - time.monotonic())))
            return
        if status not in (200, 304):
            raise HttpError(f"work {status}")
        now = time.monotonic()
        self.stats.polled[self.host] = now
        launched: set[str] = set()
        if status == 200:
            self.stats.first_list.setdefault(self.host, now - self.started)
            work = json.loads(body)
            self.items = work["items"]
            for item in self.items:
                vm, action = item["vm"], item["action"]
                if vm not in self.stats.woken:
                    self.stats.woken[vm] = now
                if action in ("launch", "migrate_in") and vm not in self.running:
                    await self._call("POST", f"/vms/{vm}/up", {"host": self.host})
                    launched.add(vm)
                # The simulated hypervisor runs what the ledger says runs here.
                if action != "migrate_in":
                    self.running.add(vm)
            self.running &= {i["vm"] for i in self.items}
            self.seen = int(work["generation"])
        said = (frozenset(self.running), self.seen)
        # The shipped agent decides while its launches are under way (a guest takes a
        # while to start), so what was just said up counts as launching, as there.
        if self.legacy or (
            said != self.reported
            and not matches_work_list(self.items, self.running - launched, launched)
        ):
            await self._report()
        self.reported = said

    async def _report(self, connection: Connection | None = None, **measures: Any) -> None:
        body = {
            "running_vms": sorted(self.running),
            "launching": [],
            "seen_generation": max(0, self.seen),
            **measures,
        }
        await self._call("POST", f"/hosts/{self.host}/report", body, connection)
        self.stats.reports += 1

    async def _call(
        self, method: str, path: str, body: Any, connection: Connection | None = None
    ) -> None:
        status, _, text = await (connection or self.calls).request(
            method, path, body, headers=self.said
        )
        self.stats.statuses[f"{path.rsplit('/', 1)[1]} {status}"] += 1
        if status >= 500 or status in (429, 503):
            raise HttpError(f"{method} {path}: {status} {text[:200]!r}")

    async def _sla(self, until: float) -> None:
        """The SLA loop of a busy host: its load moved, so a measurement-only report every
        ``sla_every`` s, the first one at a random moment within that time."""
        await asyncio.sleep(random.uniform(0, self.sla_every))
        while time.monotonic() < until:
            load = round(random.uniform(0.05, 0.95), 2)
            began = time.monotonic()
            try:
                await self._call(
                    "POST",
                    f"/hosts/{self.host}/report",
                    {"usage": {"VCPU": len(self.running)}, "load": {"cpu": load}},
                    self.sla,
                )
                self.stats.sla_ms.append((began, (time.monotonic() - began) * 1000))
            except HttpError as exc:
                self._count(exc)
            await asyncio.sleep(self.sla_every)

    async def _legacy_sla(self, until: float) -> None:
        """The old SLA loop: the whole VM list with usage and load every 15 s."""
        await asyncio.sleep(random.uniform(0, LEGACY_SLA_REPORT_S))
        while time.monotonic() < until:
            try:
                await self._report(self.sla, usage={"VCPU": len(self.running)}, load={"cpu": 0.1})
            except HttpError as exc:
                self._count(exc)
            await asyncio.sleep(LEGACY_SLA_REPORT_S)


async def _stop_when(stopping: asyncio.Event, agents: list[asyncio.Task[None]]) -> None:
    """Cancel the agents once ``stopping`` is set, and again while any still runs: on
    Python 3.11 ``asyncio.wait_for`` loses a cancellation that arrives as its inner
    request completes (gh-86296), and that agent would poll on until its deadline."""
    await stopping.wait()
    while not all(agent.done() for agent in agents):
        for agent in agents:
            agent.cancel()
        await asyncio.sleep(0.5)


async def run_fleet(
    url: str,
    token: str | None,
    hosts: list[str],
    *,
    duration: float,
    wait: float,
    legacy: bool = False,
    start_at: float | None = None,
    spread: float = 5.0,
    verbose: bool = False,
    stop_on: int | None = None,
    sla_every: float = 0.0,
) -> FleetStats:
    """Every agent runs until ``duration`` s after ``start_at`` (default now), or the
    signal ``stop_on`` (main thread only), the first polls spread at random over
    ``spread`` s, as agents started by their hosts would."""
    stats = FleetStats()
    begin = start_at if start_at is not None else time.monotonic()
    until = begin + duration

    async def one(host: str) -> None:
        await asyncio.sleep(max(0.0, begin - time.monotonic()) + random.uniform(0, spread))
        agent = SimAgent(url, token, host, stats, wait=wait, legacy=legacy, sla_every=sla_every)
        await agent.run(until)

    async def progress() -> None:
        while True:
            await asyncio.sleep(10)
            print(
                f"{len(stats.polled)} agents polled; {dict(stats.statuses)}; "
                f"{sum(stats.errors.values())} errors, e.g. {list(stats.errors)[:2]}",
                file=sys.stderr,
                flush=True,
            )

    reporter = asyncio.create_task(progress()) if verbose else None
    agents = [asyncio.create_task(one(h)) for h in hosts]
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    stopper = asyncio.create_task(_stop_when(stopping, agents))
    if stop_on is not None:
        # The signal ends the run early (the benchmark is done with the fleet): what was
        # counted so far is the answer.
        loop.add_signal_handler(stop_on, stopping.set)
    outcomes = await asyncio.gather(*agents, return_exceptions=True)
    stopper.cancel()
    if stop_on is not None:
        loop.remove_signal_handler(stop_on)
    if reporter is not None:
        reporter.cancel()
    failures = [o for o in outcomes if isinstance(o, Exception)]
    if failures:
        raise failures[0]
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token")
    parser.add_argument("--hosts", required=True, help="comma-separated host names")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--wait", type=float, default=50.0)
    parser.add_argument("--legacy", action="store_true")
    parser.add_argument("--start-at", type=float)
    parser.add_argument("--spread", type=float, default=5.0)
    parser.add_argument("--verbose", action="store_true", help="progress every 10 s")
    parser.add_argument("--sla-every", type=float, default=0.0, help="SLA reports, s apart")
    args = parser.parse_args()
    from loadmaster.api.server import raise_open_files_limit

    raise_open_files_limit()
    stats = asyncio.run(
        run_fleet(
            args.url,
            args.token,
            args.hosts.split(","),
            duration=args.duration,
            wait=args.wait,
            legacy=args.legacy,
            start_at=args.start_at,
            spread=args.spread,
            verbose=args.verbose,
            stop_on=signal.SIGTERM,
            sla_every=args.sla_every,
        )
    )
    json.dump(stats.as_dict(), sys.stdout)
    print()


if __name__ == "__main__":
    main()
