"""Soak: several API workers on PostgreSQL, client processes starting, migrating, stopping
and deleting VMs over HTTP, host agents reporting what runs where, the database stopped and
started again mid-run; audited at the end.

Usage: .venv/bin/python bench/soak.py [--duration 180] [--clients 6] [--workers 4]
                                      [--hosts 24] [--outage 4] [--max-requests 200000]
                                      [--report-every 3] [--out soak-out]

Everything runs on 127.0.0.1: a private PostgreSQL server (scripts/postgres.sh) and
``loadmaster serve --workers N``. Bounded by --duration and --max-requests. Prints requests
served, conflicts retried, 503s while the database was down, p50/p99 latency, and the final
checks; writes summary.json and timeline.png to --out. Exit code 0 when every check passes.

Each client keeps its own model of the VMs it created (state and destination), changed only
by answers it got. After an answer it cannot trust (a 503 or a broken connection: the
commit may or may not have happened) it reads the VM back before going on, as a careful
real client would. At the end the models must equal the database: a VM a client created
and the database lost, or one the database holds that no client knows of, is a failure.

One more process plays every host's agent: it lists what runs on a host and reports it.
A VM placed there but not started yet is not listed, so a report newer than its claim
ends the claim, as reconciliation must. Clients that find their VM overtaken that way
(pending back to requested) read it back and go on; any other surprise (a running VM a
report stopped, above all) fails the run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import random
import sys
import time
import uuid as uuidlib
from collections import Counter, defaultdict
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import loadmaster
from harness import PrivatePostgres, ServedApi
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.pending import audit

GROUP = "soak-ha"
CONFLICT = "loadmaster.concurrent_update"
NO_HOST = "loadmaster.no_valid_host"
INVALID_TRANSITION = "loadmaster.invalid_transition"
# What a host report may do to a VM behind its client's back: end the claim of a VM that
# had not started when its host listed what it runs. Migrations are their executor's.
REPORT_OUTCOMES = {("pending", "requested")}
UNAVAILABLE = "loadmaster.store_unavailable"
# How long a client keeps reading a VM back after an ambiguous answer before giving up.
SETTLE_S = 60.0


@dataclass
class ClientResult:
    client: int
    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    conflicts_retried: int = 0
    unavailable: int = 0
    transport_errors: int = 0
    no_valid_host: int = 0
    # second of the run -> [ok answers, 503 answers]
    timeline: dict[int, list[int]] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    vms: dict[str, str] = field(default_factory=dict)  # uuid -> state, deleted included
    unsettled: list[str] = field(default_factory=list)
    # A host report ended a pending claim (the VM was not seen starting) before the
    # client's next step on it: pending -> requested.
    overtaken_by_reports: int = 0
    # The host agents' side: reports sent and what reconciliation did with them.
    reports: int = 0
    reconciled: dict[str, int] = field(default_factory=dict)


@dataclass
class Shared:
    """What every process of the run gets. ``runs`` is the hypervisors' truth: uuid ->
    (host, since when) for every VM really running, kept by the clients, who start a VM
    before telling the API it is up and stop it before telling the API it stopped, as a
    launcher does; the host agents report from it, never from the database."""

    url: str
    token: str
    started: float
    deadline: float
    counter: Synchronized[int]
    results: mp.Queue[ClientResult]
    agents_done: EventType
    runs: MutableMapping[str, tuple[str, float]]

    def http(self) -> httpx.Client:
        headers = {**CLIENT_HEADERS, "Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)


class SoakClient:
    def __init__(self, index: int, http: httpx.Client, shared: Shared, target_vms: int) -> None:
        self.rng = random.Random(index)
        self.http = http
        self.shared = shared
        self.started = shared.started
        self.target_vms = target_vms
        self.counter = shared.counter
        self.runs = shared.runs
        self.result = ClientResult(index)
        self.state: dict[str, str] = {}
        self.host: dict[str, str | None] = {}
        self.destination: dict[str, str | None] = {}

    # -- one HTTP call, measured; 409 concurrent_update retried ------------------------
    def call(
        self, op: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> httpx.Response | None:
        """The answer, or None when the outcome is unknown (503 or a broken connection)."""
        while True:
            begun = time.monotonic()
            try:
                response = self.http.request(method, path, json=body)
            except httpx.TransportError:
                self.result.transport_errors += 1
                self._count("transport", ok=False)
                time.sleep(0.2)
                return None
            elapsed_ms = (time.monotonic() - begun) * 1000
            status = response.status_code
            self._count(str(status), ok=status < 400 or status == 409, unavailable=status == 503)
            if status < 400:
                self.result.latencies_ms.setdefault(op, []).append(elapsed_ms)
            if status == 503:
                self.result.unavailable += 1
                if (
                    response.json().get("code") != UNAVAILABLE
                    or "Retry-After" not in response.headers
                ):
                    self.unexpected(op, response)
                # As a well-behaved client: wait as told, with jitter so clients spread out.
                retry_after = float(response.headers.get("Retry-After", "1"))
                time.sleep(retry_after * (0.5 + self.rng.random()))
                return None
            if status == 409 and response.json().get("code") == CONFLICT:
                self.result.conflicts_retried += 1
                time.sleep(self.rng.random() * 0.02)
                continue
            return response

    def _count(self, status: str, *, ok: bool, unavailable: bool = False) -> None:
        r = self.result
        r.requests += 1
        r.statuses[status] = r.statuses.get(status, 0) + 1
        second = int(time.time() - self.started)
        slot = r.timeline.setdefault(second, [0, 0])
        if ok:
            slot[0] += 1
        elif unavailable:
            slot[1] += 1
        with self.counter.get_lock():
            self.counter.value += 1

    # -- the client's model of its VMs -----------------------------------------------------
    def learn(self, view: dict[str, Any]) -> None:
        uuid = view["uuid"]
        self.state[uuid] = view["state"]
        self.host[uuid] = view.get("host")
        self.destination[uuid] = view.get("target_host")
        # The hypervisor follows what the database settled: a VM whose claim a report ended
        # is killed; a migration rolled back leaves it where it was.
        running_on = self.host[uuid] if view["state"] in ("running", "migrating") else None
        current = self.runs.get(uuid)
        if running_on is None:
            self.runs.pop(uuid, None)
        elif current is None or current[0] != running_on:
            self.runs[uuid] = (running_on, time.time())

    def settle(self, uuid: str) -> None:
        """Read the VM back after an answer that proved nothing."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            response = self.call("read", "GET", f"/vms/{uuid}")
            if response is None:
                continue
            if response.status_code == 404:
                self.state.pop(uuid, None)  # a create that never committed
                self.runs.pop(uuid, None)
                return
            if response.status_code == 200:
                self.learn(response.json())
                return
            self.unexpected("read", response)
            return
        self.result.unsettled.append(uuid)

    def unexpected(self, op: str, response: httpx.Response) -> None:
        if len(self.result.unexpected) < 20:
            self.result.unexpected.append(f"{op}: {response.status_code} {response.text[:300]}")
        else:
            self.result.unexpected.append(f"{op}: {response.status_code}")

    def expect(self, op: str, uuid: str, response: httpx.Response | None, *ok: int) -> bool:
        if response is None:
            self.settle(uuid)
            return False
        if response.status_code in ok:
            return True
        code = response.json().get("code") if response.status_code == 409 else None
        if code == NO_HOST:
            self.result.no_valid_host += 1
            return False
        if code != INVALID_TRANSITION or not self.overtaken(uuid):
            self.unexpected(op, response)
        return False

    def overtaken(self, uuid: str) -> bool:
        """Read the VM back; True when a host report moved it the only ways it may."""
        believed = self.state.get(uuid)
        self.settle(uuid)
        if (believed, self.state.get(uuid)) in REPORT_OUTCOMES:
            self.result.overtaken_by_reports += 1
            return True
        return False

    def settle_after_reports(self) -> None:
        """Once the agents stopped, every VM is read back: one waiting to start may have
        lost its claim to a last report the client never stepped on; anything else (a
        running VM a report stopped, above all) must be as believed."""
        for uuid, believed in list(self.state.items()):
            if believed == "deleted" or self.overtaken(uuid):
                continue
            if self.state.get(uuid) != believed:
                self.result.unexpected.append(
                    f"final read: {uuid} {believed} -> {self.state.get(uuid)}"
                )

    # -- the workload ------------------------------------------------------------------
    def step(self) -> None:
        alive = [u for u, s in self.state.items() if s != "deleted"]
        if len(alive) < self.target_vms and self.rng.random() < 0.5:
            self.create()
            return
        if not alive:
            return
        uuid = self.rng.choice(alive)
        roll = self.rng.random()
        match self.state[uuid]:
            case "requested":
                self.start(uuid)
            case "pending":
                self.boot(uuid)
            case "running" if roll < 0.45:
                self.migrate(uuid)
            case "running" if roll < 0.8:
                self.runs.pop(uuid, None)  # shut down first, then tell the API
                self.transition("stop", uuid, f"/vms/{uuid}/stop")
            case "running":
                self.delete(uuid)
            case "migrating" if roll < 0.75:
                self.boot(uuid)
            case "migrating":
                self.abort_migration(uuid)
            case "stopped" if roll < 0.6:
                self.start(uuid)
            case "stopped":
                self.delete(uuid)

    def create(self) -> None:
        uuid = str(uuidlib.UUID(int=self.rng.getrandbits(128)))
        body: dict[str, Any] = {
            "uuid": uuid,
            "name": f"soak-{self.result.client}-{len(self.state)}",
            "flavor": self.rng.choice(["small", "small", "large"]),
        }
        if self.rng.random() < 0.1:
            body["group"] = GROUP
        self.state[uuid] = "requested"  # until proven otherwise (settle drops it)
        response = self.call("create", "POST", "/vms", body)
        if self.expect("create", uuid, response, 201):
            assert response is not None
            self.learn(response.json())

    def start(self, uuid: str) -> None:
        response = self.call("start", "POST", f"/vms/{uuid}/start")
        if self.expect("start", uuid, response, 200):
            assert response is not None
            self.learn(response.json()["vm"])

    def migrate(self, uuid: str) -> None:
        body = {"reason": "soak"}
        response = self.call("migrate", "POST", f"/vms/{uuid}/migrate", body)
        if self.expect("migrate", uuid, response, 200):
            assert response is not None
            self.learn(response.json()["vm"])

    def transition(self, op: str, uuid: str, path: str) -> None:
        response = self.call(op, "POST", path)
        if self.expect(op, uuid, response, 200):
            assert response is not None
            self.learn(response.json())

    def abort_migration(self, uuid: str) -> None:
        path = f"/vms/{uuid}/allocations?host={self.destination[uuid]}"
        if self.expect("abort", uuid, self.call("abort", "DELETE", path), 204):
            self.state[uuid], self.destination[uuid] = "running", None  # it never left

    def boot(self, uuid: str) -> None:
        """The VM starts (or resumes at its migration's destination), then the API is told."""
        where = self.destination[uuid] if self.state[uuid] == "migrating" else self.host[uuid]
        assert where is not None
        self.runs[uuid] = (where, time.time())
        self.transition("up", uuid, f"/vms/{uuid}/up")

    def delete(self, uuid: str) -> None:
        self.runs.pop(uuid, None)
        if self.expect("delete", uuid, self.call("delete", "DELETE", f"/vms/{uuid}"), 204):
            self.state[uuid] = "deleted"


class HostAgents(SoakClient):
    """The agents of every host, as one process: each host in turn lists what its
    hypervisor runs (``Shared.runs``) and reports it with the time of the listing. A VM
    placed on the host but not started yet is not listed, so a report newer than its
    claim ends the claim (the VM did not start): what pending records are for."""

    def __init__(self, shared: Shared, hosts: list[str], every_s: float) -> None:
        super().__init__(-1, shared.http(), shared, 0)
        self.hosts, self.every_s, self.next_host = hosts, every_s, 0

    def step(self) -> None:
        host = self.hosts[self.next_host % len(self.hosts)]
        self.next_host += 1
        as_of = datetime.now(UTC)
        running = [uuid for uuid, (where, _since) in list(self.runs.items()) if where == host]
        body = {"running_vms": running, "as_of": as_of.isoformat()}
        response = self.call("report", "POST", f"/hosts/{host}/report", body)
        if response is not None and response.status_code == 200:
            self.result.reports += 1
            for outcome, uuids in response.json().items():
                self.result.reconciled[outcome] = self.result.reconciled.get(outcome, 0) + len(
                    uuids
                )
        elif response is not None:
            self.unexpected("report", response)
        time.sleep(self.every_s / len(self.hosts))


def agents_main(shared: Shared, hosts: list[str], every_s: float) -> None:
    try:
        agents = HostAgents(shared, hosts, every_s)
        with agents.http:
            while time.time() < shared.deadline:
                agents.step()
        shared.results.put(agents.result)
    finally:
        shared.agents_done.set()


def client_main(index: int, shared: Shared, max_requests: int, target_vms: int) -> None:
    with shared.http() as http:
        client = SoakClient(index, http, shared, target_vms)
        while time.time() < shared.deadline and client.result.requests < max_requests:
            client.step()
        if shared.agents_done.wait(timeout=SETTLE_S):
            client.settle_after_reports()
        else:
            client.result.unexpected.append("the host agents did not stop")
    client.result.vms = dict(client.state)
    shared.results.put(client.result)


# -- the run ----------------------------------------------------------------------------
def build_cluster(url: str, hosts: int) -> list[str]:
    names = [f"soak-host-{i:02d}" for i in range(hosts)]
    with loadmaster.open(url) as lm:
        for name in names:
            lm.hosts.create(
                name, inventories={"VCPU": {"total": 16}, "MEMORY_MB": {"total": 32768}}
            )
        lm.flavors.create({"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 4096}})
        lm.flavors.create({"name": "large", "resources": {"VCPU": 4, "MEMORY_MB": 8192}})
        lm.groups.create(GROUP, "anti-affinity")
    return names


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def final_checks(
    url: str, results: list[ClientResult], outage_503s: int, with_agents: bool
) -> list[Check]:
    expected: dict[str, str] = {}
    for r in results:
        expected.update(r.vms)
    with loadmaster.open(url, migrate=False) as lm:
        problems = audit(lm.store)
        usages = lm.allocations.usages()
        vms = {v.uuid: v for v in lm.vms.list(include_deleted=True)}
        records = lm.allocations.allocations()
    over = [
        f"{host}/{cls}: {u.used} of {u.capacity}"
        for host, classes in usages.items()
        for cls, u in classes.items()
        if u.used > u.capacity
    ]
    lost = [u for u, s in expected.items() if u not in vms or vms[u].state != s]
    unknown = [u for u, v in vms.items() if u not in expected]
    by_kind = Counter(p.kind for p in problems)
    pending_vms = {r.vm for r in records if r.state == "pending"}
    not_up = {u for u, v in vms.items() if v.state in ("pending", "migrating")}
    members: dict[str, list[str]] = defaultdict(list)
    for v in vms.values():
        if v.group == GROUP and v.state != "deleted":
            for host in {v.host, v.target_host} - {None}:
                members[str(host)].append(v.uuid)
    crowded = {h: m for h, m in members.items() if len(m) > 1}
    unexpected = [line for r in results for line in r.unexpected]
    reports = sum(r.reports for r in results)
    reconciled: Counter[str] = Counter()
    for r in results:
        reconciled.update(r.reconciled)
    unsettled = [u for r in results for u in r.unsettled]
    return [
        Check("audit clean", not problems, f"{len(problems)} problems {dict(by_kind)}"),
        Check("zero overcommit", not over, f"{len(over)} host/class over capacity {over[:3]}"),
        Check(
            "zero orphaned allocations",
            by_kind["orphaned"] == 0,
            f"{by_kind['orphaned']} orphaned, {by_kind['partial_claim']} partial claims",
        ),
        Check(
            "zero lost VMs",
            not lost and not unknown and not unsettled,
            f"{len(expected)} VMs known to clients; {len(lost)} lost or diverged, "
            f"{len(unknown)} unknown to any client, {len(unsettled)} never settled",
        ),
        Check(
            "pending records == VMs not yet up",
            pending_vms == not_up,
            f"{len(pending_vms)} VMs with pending records, {len(not_up)} pending or migrating",
        ),
        Check(
            "anti-affinity kept",
            not crowded,
            f"{sum(len(m) for m in members.values())} group members, {len(crowded)} shared hosts",
        ),
        Check("no unexpected answers", not unexpected, f"{len(unexpected)} {unexpected[:3]}"),
        Check(
            "host agents reported",
            not with_agents or reports > 0,
            f"{reports} reports: {dict(reconciled)}",
        ),
        Check(
            "database outage seen and survived",
            outage_503s > 0,
            f"{outage_503s} answers were 503 while PostgreSQL was down",
        ),
    ]


def summarise(
    results: list[ClientResult], wall_s: float, outage: tuple[float, float], checks: list[Check]
) -> dict[str, Any]:
    latencies: dict[str, list[float]] = defaultdict(list)
    for r in results:
        for op, values in r.latencies_ms.items():
            latencies[op] += values
    every = [v for values in latencies.values() for v in values]
    statuses: Counter[str] = Counter()
    for r in results:
        statuses.update(r.statuses)
    after_resume = sorted(
        second
        for r in results
        for second, (ok, _bad) in r.timeline.items()
        if second >= outage[1] and ok
    )
    return {
        "duration_s": round(wall_s, 1),
        "requests": sum(r.requests for r in results),
        "requests_per_s": round(sum(r.requests for r in results) / wall_s, 1),
        "statuses": dict(sorted(statuses.items())),
        "conflicts_retried": sum(r.conflicts_retried for r in results),
        "unavailable_503": sum(r.unavailable for r in results),
        "transport_errors": sum(r.transport_errors for r in results),
        "no_valid_host": sum(r.no_valid_host for r in results),
        "host_reports": sum(r.reports for r in results),
        "reconciled": dict(sum((Counter(r.reconciled) for r in results), Counter())),
        "overtaken_by_reports": sum(r.overtaken_by_reports for r in results),
        "outage_s": [round(outage[0], 1), round(outage[1], 1)],
        "first_ok_after_resume_s": (
            round(after_resume[0] - outage[1], 1) if after_resume else None
        ),
        "latency_ms": {
            op: {
                "count": len(values),
                "p50": round(float(np.percentile(values, 50)), 2),
                "p99": round(float(np.percentile(values, 99)), 2),
            }
            for op, values in sorted({"all": every, **latencies}.items())
            if values
        },
        "checks": [asdict(c) for c in checks],
    }


def plot_timeline(results: list[ClientResult], outage: tuple[float, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = max((s for r in results for s in r.timeline), default=0) + 1
    ok, bad = np.zeros(seconds), np.zeros(seconds)
    for r in results:
        for second, (good, unavailable) in r.timeline.items():
            ok[second] += good
            bad[second] += unavailable
    figure, ax = plt.subplots(figsize=(10, 3.5))
    ax.plot(ok, color="#2b6cb0", label="answered (2xx, 409)")
    ax.plot(bad, color="#c53030", label="503 store unavailable")
    ax.axvspan(*outage, color="#fed7d7", alpha=0.6, label="PostgreSQL stopped")
    ax.set_xlabel("second of the soak")
    ax.set_ylabel("requests per second")
    ax.legend(loc="upper right")
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    console.print(
        f"{summary['requests']:,} requests in {summary['duration_s']} s "
        f"({summary['requests_per_s']}/s); statuses {summary['statuses']}"
    )
    console.print(
        f"conflicts retried {summary['conflicts_retried']}, 503 {summary['unavailable_503']}, "
        f"broken connections {summary['transport_errors']}, no valid host "
        f"{summary['no_valid_host']}; PostgreSQL down {summary['outage_s'][0]}-"
        f"{summary['outage_s'][1]} s, first success {summary['first_ok_after_resume_s']} s "
        "after it came back"
    )
    console.print(
        f"host reports {summary['host_reports']:,} (reconciled {summary['reconciled']}); "
        f"client steps overtaken by a report {summary['overtaken_by_reports']}"
    )
    latency = Table("operation", "count", "p50 ms", "p99 ms", title="latency of answered requests")
    for op, figures in summary["latency_ms"].items():
        latency.add_row(op, f"{figures['count']:,}", str(figures["p50"]), str(figures["p99"]))
    console.print(latency)
    checks = Table("check", "result", "detail", title="final checks")
    for c in summary["checks"]:
        checks.add_row(c["name"], "[green]ok[/]" if c["ok"] else "[red]FAILED[/]", c["detail"])
    console.print(checks)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with PrivatePostgres() as pg:
        hosts = build_cluster(pg.url, args.hosts)
        with ServedApi(pg.url, args.workers, out / "serve.log") as api:
            server_pid = api.process.pid
            ctx = mp.get_context("spawn")
            manager = ctx.Manager()
            started = time.time()
            shared = Shared(
                api.url,
                api.token,
                started,
                started + args.duration,
                ctx.Value("q", 0),
                ctx.Queue(),
                ctx.Event(),
                manager.dict(),
            )
            deadline, counter, results_queue = shared.deadline, shared.counter, shared.results
            if args.report_every <= 0:
                shared.agents_done.set()
            clients = [
                ctx.Process(
                    target=client_main, args=(i, shared, args.max_requests, args.vms_per_client)
                )
                for i in range(args.clients)
            ]
            if args.report_every > 0:
                clients.append(
                    ctx.Process(target=agents_main, args=(shared, hosts, args.report_every))
                )
            for proc in clients:
                proc.start()
            outage_at = started + args.duration * args.outage_at
            outage = (0.0, 0.0)
            with Progress(
                TextColumn("soak"),
                BarColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[requests]:,} requests {task.fields[note]}"),
                console=console,
            ) as progress:
                task = progress.add_task("soak", total=args.duration, requests=0, note="")
                results: list[ClientResult] = []
                # Results are read as they come: a process whose queue was not drained cannot
                # exit, so waiting for the processes first would wait forever.
                while len(results) < len(clients) and time.time() < deadline + SETTLE_S:
                    if outage == (0.0, 0.0) and time.time() >= outage_at:
                        progress.update(task, note="[red]PostgreSQL stopped")
                        pg.halt()
                        halted = time.time()
                        time.sleep(args.outage)
                        pg.resume()
                        outage = (halted - started, time.time() - started)
                        progress.update(task, note="")
                    progress.update(
                        task,
                        completed=min(args.duration, time.time() - started),
                        requests=counter.value,
                    )
                    try:
                        results.append(results_queue.get(timeout=0.5))
                    except queue.Empty:
                        if not any(p.is_alive() for p in clients):
                            break  # a client died without reporting
            for proc in clients:
                proc.join(timeout=10)
            manager.shutdown()
            wall = time.time() - started
            same_server = api.process.poll() is None and api.process.pid == server_pid
        outage_503s = sum(
            bad
            for r in results
            for second, (_ok, bad) in r.timeline.items()
            if outage[0] - 1 <= second <= outage[1] + 1
        )
        checks = final_checks(pg.url, results, outage_503s, args.report_every > 0)
        checks.append(
            Check("served without a restart", same_server, f"loadmaster serve pid {server_pid}")
        )
        checks.append(
            Check(
                "every client reported",
                len(results) == len(clients),
                f"{len(results)} of {len(clients)} client processes",
            )
        )
    summary = summarise(results, wall, outage, checks)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_timeline(results, outage, out / "timeline.png")
    print_summary(Console(), summary)
    console.print(f"summary.json and timeline.png in {out}/")
    return 0 if all(c.ok for c in checks) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=6, help="client processes")
    parser.add_argument("--workers", type=int, default=4, help="API worker processes")
    parser.add_argument("--hosts", type=int, default=24, help="hosts (16 VCPU, 32 GiB each)")
    parser.add_argument("--vms-per-client", type=int, default=40)
    parser.add_argument("--outage", type=float, default=4.0, help="seconds PostgreSQL is down")
    parser.add_argument(
        "--outage-at", type=float, default=0.4, help="when it goes down (fraction of the run)"
    )
    parser.add_argument(
        "--report-every",
        type=float,
        default=3.0,
        help="seconds between two reports of one host by its simulated agent (0: no agents)",
    )
    parser.add_argument("--max-requests", type=int, default=200_000, help="per client")
    parser.add_argument("--out", default="soak-out", help="where summary.json and the plot go")
    args = parser.parse_args()
    if not 0 < args.outage_at < 1 or args.outage >= args.duration * (1 - args.outage_at):
        parser.error("the outage must start and end inside the run (--outage-at, --outage)")
    sys.exit(run(args))


if __name__ == "__main__":
    main()
