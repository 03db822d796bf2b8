"""A fleet of host agents against the API (issue #24): what an idle fleet costs the server,
how fast a claim reaches its host's agent, and what the fleet does to placements.

Usage: .venv/bin/python bench/fleet.py [--hosts 1000 10000] [--backends sqlite postgres]
       [--idle 120] [--placements 200] [--processes 4] [--baseline-hosts 200 1000]
       [--baseline-ref REF] [--no-baseline] [--png bench/out/fleet.png]
       [--cold-start] [--sla-every SECONDS]

Per run: ``--hosts`` root hosts with an agent registered each (VCPU 64, MEMORY_MB 256 GiB);
``loadmaster serve`` on SQLite (one process), or two ``serve`` processes on two ports
sharing one private PostgreSQL, as two machines would. Simulated agents
(bench/fleet_agents.py: the shipped host manager's cadence, asyncio over raw HTTP, in
``--processes`` client processes, loopback only, bounded in time) start with their first
polls spread over a few seconds (hosts / 250, at least 3; ``--cold-start``: all within
5 s, a fleet powered on together); with two servers each client process talks to one of
them. With ``--sla-every S`` each agent's SLA loop also sends a measurement-only report
every S seconds (nova-compute's periodic cadence is 60). Then:

1. ``--placements`` ``POST /schedule`` calls of one VM each, one at a time, *before* the
   agents start: the latency without the fleet;
2. the fleet settles, then ``--idle`` seconds in which nothing changes: the CPU the
   server processes spent (utime + stime from /proc, loadmaster's processes only, as %
   of one core) and the requests they answered (their own /metrics);
3. the same placements *with* the fleet waiting; on PostgreSQL through the two servers in
   turn. Wake-up: from the start of the ``POST /schedule`` to the moment the host's agent
   read the VM on its work list (time.monotonic is one clock for every process here); on
   two servers, split into the agent's own server and the other one;
4. (this checkout only) the first server is killed (``kill -9``) and started again on its
   port: the seconds until all its agents wait on it again (its
   ``loadmaster_agent_polls_waiting``), with every error they met counted, and every VM
   placed still running at the end.

Printed per run: hosts, backend, build, the seconds from each agent's start to its first
work list (p50, p99, max, and how many agents got one), idle CPU % of one core (per 1,000
hosts too),
requests/s while idle, wake-up p50/p99 ms, ``POST /schedule`` p50/p99 ms without and with
the fleet (and the ratio), the servers' peak RSS and their collector's pauses (count, total, longest, per server
process, from their /metrics), the SLA reports' latency p50/p99, errors (answers other than
200, 304 and 503, failed placements; requests no server answered, as when it restarts,
are listed apart), VMs left unclaimed or not running, the audit's problems,
and the seconds the agents took to be back after the restart. The baseline
(``--baseline-ref``, default the commit issue #24 starts from) runs the same with its own
agent cadence (``--legacy`` in fleet_agents.py: a 5 s long-poll, a report
every pass, the SLA loop's full report every 15 s) at ``--baseline-hosts``. The figures
are plotted (idle CPU and wake-up p99 against hosts) to ``--png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import insert, select

import loadmaster
from harness import (
    ROOT,
    PrivatePostgres,
    ServedApi,
    checkout,
    machine,
    remove_checkout,
    run_worker,
)
from loadmaster.cluster import VmSpec
from loadmaster.pending import audit
from loadmaster.store.locking import now
from loadmaster.store.schema import HostAgentRow, HostRow

ISSUE_START = "2f2a0d7"
NODE = {"VCPU": {"total": 64}, "MEMORY_MB": {"total": 262144}}
RESTART_LIMIT_S = 120.0
TRANSPORT_ERRORS = (
    "ConnectionRefusedError",
    "ConnectionResetError",
    "IncompleteReadError",
    "TimeoutError",
    "BrokenPipeError",
)
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Build:
    name: str
    pythonpath: str | None = None  # None: this checkout
    legacy: bool = False

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.pythonpath is not None:
            env["PYTHONPATH"] = self.pythonpath
        return env


@dataclass
class Result:
    hosts: int
    backend: str
    build: str
    idle_cpu_pct: float = 0.0
    idle_rps: float = 0.0
    wake_ms: list[float] = field(default_factory=list)
    wake_other_ms: list[float] = field(default_factory=list)
    schedule_alone_ms: list[float] = field(default_factory=list)
    schedule_fleet_ms: list[float] = field(default_factory=list)
    rss_mib: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    unanswered: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    audit_problems: int = 0
    agents_back: int = 0
    settle_s: float = 0.0
    # Seconds from each agent's start to its first work list; SLA reports' latencies, of
    # all and of those sent in the steady window (the idle time and the placements with
    # the fleet: neither the start nor the restart).
    first_list_s: list[float] = field(default_factory=list)
    sla_ms: list[float] = field(default_factory=list)
    sla_steady_ms: list[float] = field(default_factory=list)
    # Per server process: the collector's pauses (count, total s, longest s, how many over
    # SLOW_PAUSE_S) until the placements with the fleet ended.
    gc_pauses: list[tuple[int, float, float, int]] = field(default_factory=list)
    # Per server process: its pauses over SLOW_PAUSE_S within the steady window.
    slow_pauses_steady: list[int] = field(default_factory=list)
    shed: int = 0
    # The placements with the fleet: route -> (requests, mean ms) the servers answered
    # meanwhile, long-polls left out (their time is waiting).
    busy_routes: dict[str, tuple[int, float]] = field(default_factory=dict)
    # After a kill -9 and restart of the first server: seconds until its agents all wait
    # again (None: not measured, or not all came back within RESTART_LIMIT_S).
    back_s: float | None = None


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def peak_rss_mib(pids: list[int]) -> float:
    peak = 0.0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]) / 1024)
    return peak


def metrics_text(api: ServedApi) -> str:
    """The server's /metrics. A server busy with a fleet's first contacts may not accept
    at once: asked again."""
    for attempt in range(10):
        try:
            with api.client(timeout=60) as http:
                return http.get("/metrics").text
        except httpx.TransportError:
            if attempt == 9:
                raise
            time.sleep(2)
    raise AssertionError("unreachable")


def requests_answered(api: ServedApi, *only: str) -> float:
    """Requests the server answered (its /metrics), those whose labels say all of ``only``."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text(api).splitlines()
        if line.startswith("loadmaster_http_requests_total{") and all(o in line for o in only)
    )


def seconds_by_route(apis: list[ServedApi]) -> defaultdict[tuple[str, str], float]:
    """(route, "count" or "sum") -> requests answered and seconds spent answering them,
    over the servers (their request-duration histograms)."""
    totals: defaultdict[tuple[str, str], float] = defaultdict(float)
    for api in apis:
        for line in metrics_text(api).splitlines():
            for part in ("count", "sum"):
                head = f'loadmaster_http_request_seconds_{part}{{route="'
                if line.startswith(head):
                    route = line[len(head) :].split('"', 1)[0]
                    totals[route, part] += float(line.rsplit(" ", 1)[1])
    return totals


# A pause longer than this is a full collection's at 10,000 agents, not a young one's.
SLOW_PAUSE_S = 0.05


def gc_pauses(api: ServedApi) -> tuple[int, float, float, int]:
    """The server's garbage-collector pauses so far (its /metrics): how many, their total
    and the longest, in seconds, and how many took longer than SLOW_PAUSE_S."""
    wanted = {
        "count": "loadmaster_gc_pause_seconds_count ",
        "sum": "loadmaster_gc_pause_seconds_sum ",
        "longest": "loadmaster_gc_pause_longest_seconds ",
        "within": f'loadmaster_gc_pause_seconds_bucket{{le="{SLOW_PAUSE_S}"}} ',
    }
    values = {
        key: float(line.rsplit(" ", 1)[1])
        for line in metrics_text(api).splitlines()
        for key, head in wanted.items()
        if line.startswith(head)
    }
    count = int(values.get("count", 0))
    slow = count - int(values.get("within", 0))
    return count, values.get("sum", 0.0), values.get("longest", 0.0), slow


def polls_waiting(api: ServedApi) -> float:
    """The long-polls the server holds open (its /metrics); 0 while it does not answer."""
    try:
        with api.client(timeout=10) as http:
            text = http.get("/metrics").text
    except httpx.TransportError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("loadmaster_agent_polls_waiting ")
    )


def restart(
    api: ServedApi, url: str, agents: int, env: dict[str, str], log: Path
) -> tuple[ServedApi, float]:
    """``kill -9`` the server and start it again on its port, as a crash and its service
    manager would; the new server, and the seconds until its ``agents`` all wait again
    (``nan`` if not within ``RESTART_LIMIT_S``)."""
    api.process.kill()
    api.process.wait()
    api.close()
    begun = time.monotonic()
    again = ServedApi(url, 1, log_path=log, env=env, port=api.port, token=api.token)
    while time.monotonic() - begun < RESTART_LIMIT_S:
        if polls_waiting(again) >= agents:
            return again, time.monotonic() - begun
        time.sleep(1)
    return again, float("nan")


def settle(apis: list[ServedApi], hosts: int, timeout: float) -> float:
    """Until every agent has read its first work list; the seconds it took."""
    started = time.monotonic()
    first_lists = ('route="/hosts/{host_name}/work"', 'status="200"')
    while time.monotonic() - started < timeout:
        if sum(requests_answered(api, *first_lists) for api in apis) >= hosts:
            break
        time.sleep(2)
    return time.monotonic() - started


def prepare(build: Build, url: str, hosts: int, vms: int) -> list[str]:
    """``prepare_here`` in a process of the build under test: its own schema migrations
    make the database, so that it can serve it."""
    out = run_worker(__file__, "prepare", url, str(hosts), str(vms), env=build.env())
    return list(out["uuids"])


def prepare_here(url: str, hosts: int, vms: int) -> list[str]:
    """Hosts with agents registered, and ``vms`` requested VMs to place."""
    with loadmaster.open(url) as lm:
        lm.hosts.create_many([{"name": f"h{i}", "inventories": NODE} for i in range(hosts)])
        stamp = now()
        with lm.store.write() as session:
            ids = session.scalars(select(HostRow.id)).all()
            session.execute(
                insert(HostAgentRow),
                [
                    {
                        "host_id": i,
                        "hypervisor_uri": "test:///default",
                        "registered_at": stamp,
                        "last_seen_at": stamp,
                        "seen_generation": 0,
                    }
                    for i in ids
                ],
            )
        lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
        return [v.uuid for v in lm.vms.create_many([VmSpec(f"v{i}", "small") for i in range(vms)])]


def place(
    apis: list[ServedApi], uuids: list[str], started: dict[str, tuple[float, int]]
) -> tuple[list[float], int]:
    """One VM per ``POST /schedule``, through the servers in turn; latencies in ms."""
    latencies, failed = [], 0
    clients = [api.client(timeout=15) for api in apis]
    try:
        for n, uuid in enumerate(uuids):
            which = n % len(clients)
            begun = time.monotonic()
            started[uuid] = (begun, which)
            try:
                response = clients[which].post("/schedule", json={"requests": [{"vms": [uuid]}]})
                ok = response.status_code == 200 and response.json()["placements"][0]["host"]
            except Exception:
                ok = False
            latencies.append((time.monotonic() - begun) * 1000)
            failed += 0 if ok else 1
            time.sleep(0.02)
    finally:
        for client in clients:
            client.close()
    return latencies, failed


def run(args: argparse.Namespace, build: Build, backend: str, hosts: int, work: Path) -> Result:
    from loadmaster.agent.manager.host_manager import DEFAULT_WAIT_S

    result = Result(hosts, backend, build.name)
    placements = args.placements if not build.legacy else min(args.placements, 50)
    postgres = PrivatePostgres() if backend == "postgres" else None
    name = f"fleet-{hosts}-{build.name.split()[0]}"
    url = postgres.url if postgres else f"sqlite:///{work / f'{name}.db'}"
    apis: list[ServedApi] = []
    agents: list[subprocess.Popen[str]] = []
    try:
        uuids = prepare(build, url, hosts, 2 * placements)
        for n in range(2 if postgres else 1):
            apis.append(ServedApi(url, 1, log_path=work / f"{name}-{n}.log", env=build.env()))
        pids = [api.process.pid for api in apis]
        started: dict[str, tuple[float, int]] = {}
        result.schedule_alone_ms, failed = place(apis, uuids[:placements], started)
        # First polls read each agent's work list once: spread as hosts booting would be,
        # at about what one server reads in a second (the rest are told to come back).
        spread = 5.0 if args.cold_start else max(3.0, hosts / 250)
        settle_limit = 300.0
        duration = spread + settle_limit + 5 + args.idle + placements * 0.2 + 30 + RESTART_LIMIT_S
        begin = time.monotonic() + 2
        names = [f"h{i}" for i in range(hosts)]
        for p in range(args.processes):
            api = apis[p % len(apis)]
            command = [
                sys.executable,
                str(ROOT / "bench/fleet_agents.py"),
                "--url",
                api.url,
                "--token",
                api.token,
                "--hosts",
                ",".join(names[p :: args.processes]),
                "--duration",
                f"{duration:.1f}",
                "--wait",
                str(DEFAULT_WAIT_S),
                "--start-at",
                f"{begin:.3f}",
                "--spread",
                f"{spread:.1f}",
                *(["--legacy"] if build.legacy else []),
                *(["--sla-every", str(args.sla_every)] if args.sla_every else []),
            ]
            agents.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        time.sleep(max(0.0, begin + spread - time.monotonic()))
        if build.legacy:  # its agents read their list on every poll: no first reads to await
            result.settle_s = 10.0
            time.sleep(result.settle_s)
        else:
            result.settle_s = settle(apis, hosts, timeout=settle_limit)
        time.sleep(5)
        req0 = sum(map(requests_answered, apis))
        slow0 = [gc_pauses(api)[3] for api in apis] if not build.legacy else []
        cpu0, t0 = cpu_seconds(pids), time.monotonic()
        time.sleep(args.idle)
        seconds = time.monotonic() - t0
        result.idle_cpu_pct = 100 * (cpu_seconds(pids) - cpu0) / seconds
        # The two /metrics reads are in the count: requests (not the CPU window) span them.
        result.idle_rps = (sum(map(requests_answered, apis)) - req0) / (time.monotonic() - t0)
        before = seconds_by_route(apis)
        result.schedule_fleet_ms, failed_later = place(apis, uuids[placements:], started)
        after = seconds_by_route(apis)
        steady = (t0, time.monotonic())
        spent = {key: after[key] - before[key] for key in after}
        result.busy_routes = {
            route: (int(n), 1000 * spent[route, "sum"] / n)
            for (route, part), n in spent.items()
            if part == "count" and n and not route.endswith("/work") and route != "/metrics"
        }
        result.rss_mib = peak_rss_mib(pids)
        if not build.legacy:
            result.gc_pauses = [gc_pauses(api) for api in apis]
            result.slow_pauses_steady = [
                pauses[3] - before for pauses, before in zip(result.gc_pauses, slow0, strict=True)
            ]
        if not build.legacy:
            mine = sum(
                len(names[p :: args.processes]) for p in range(args.processes) if p % len(apis) == 0
            )
            apis[0], result.back_s = restart(
                apis[0], url, mine, build.env(), work / f"{name}-0-restarted.log"
            )
        for agent in agents:
            agent.terminate()
        outputs = [json.loads(a.communicate(timeout=120)[0]) for a in agents]
        woken: dict[str, float] = {}
        for n, out in enumerate(outputs):
            result.first_list_s.extend(out.get("first_list", {}).values())
            for sent, ms in out.get("sla_ms", []):
                result.sla_ms.append(ms)
                if steady[0] <= sent <= steady[1]:
                    result.sla_steady_ms.append(ms)
            for vm, at in out["woken"].items():
                woken[vm] = at
                began, via = started.get(vm, (None, 0))
                if began is None or vm not in set(uuids[placements:]):
                    continue
                mine = n % len(apis) == via
                (result.wake_ms if mine else result.wake_other_ms).append((at - began) * 1000)
            for status, count in out["statuses"].items():
                if status.endswith(" 503"):
                    # Turned away with a later turn (HostWatch.reading): shed, not failed.
                    result.shed += count
                elif not status.endswith((" 200", " 304")):
                    result.errors[status] = result.errors.get(status, 0) + count
            for error, count in out["errors"].items():
                if error.endswith(TRANSPORT_ERRORS):
                    # The server down (its restart) or dropping a connection: no answer.
                    result.unanswered[error] = result.unanswered.get(error, 0) + count
                else:
                    result.errors[error] = result.errors.get(error, 0) + count
        result.agents_back = sum(len(out["polled"]) for out in outputs)
        if failed or failed_later:
            result.errors["failed placements"] = failed + failed_later
        for api in apis:
            api.close()
        with loadmaster.open(url) as lm:
            states = [lm.vms.get(u).state for u in uuids[placements:]]
            # With the fleet, every VM placed must have been started by its agent.
            result.lost = sum(1 for s in states if s != "running")
            result.audit_problems = len(audit(lm.store))
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        for api in apis:
            api.close()
        if postgres is not None:
            postgres.close()
    return result


def q(values: list[float], p: float) -> str:
    return f"{float(np.percentile(values, p)):.1f}" if values else "-"


def report(results: list[Result]) -> None:
    head = (
        f"{'hosts':>6} {'backend':8} {'build':16} {'1st list p50':>12} {'p99':>6} {'max':>6} "
        f"{'got':>6} {'idle CPU %':>10} {'/1k hosts':>9} "
        f"{'req/s':>7} {'wake p50':>8} {'p99':>7} {'other p50':>9} {'p99':>7} "
        f"{'sched alone p50':>15} {'p99':>6} {'fleet p50':>9} {'p99':>6} {'x p99':>6} "
        f"{'RSS MiB':>7} {'errors':>6} {'lost':>4} {'audit':>5} {'settled s':>9} {'503s':>6} "
        f"{'back s':>6}"
    )
    print(head)
    for r in results:
        ratio = (
            float(np.percentile(r.schedule_fleet_ms, 99))
            / float(np.percentile(r.schedule_alone_ms, 99))
            if r.schedule_fleet_ms and r.schedule_alone_ms
            else float("nan")
        )
        print(
            f"{r.hosts:>6} {r.backend:8} {r.build:16} {q(r.first_list_s, 50):>12} "
            f"{q(r.first_list_s, 99):>6} {q(r.first_list_s, 100):>6} {len(r.first_list_s):>6} "
            f"{r.idle_cpu_pct:>10.1f} "
            f"{r.idle_cpu_pct * 1000 / r.hosts:>9.2f} {r.idle_rps:>7.1f} "
            f"{q(r.wake_ms, 50):>8} {q(r.wake_ms, 99):>7} "
            f"{q(r.wake_other_ms, 50):>9} {q(r.wake_other_ms, 99):>7} "
            f"{q(r.schedule_alone_ms, 50):>15} {q(r.schedule_alone_ms, 99):>6} "
            f"{q(r.schedule_fleet_ms, 50):>9} {q(r.schedule_fleet_ms, 99):>6} {ratio:>6.2f} "
            f"{r.rss_mib:>7.0f} {sum(r.errors.values()):>6} {r.lost:>4} {r.audit_problems:>5} "
            f"{r.settle_s:>9.0f} {r.shed:>6} "
            f"{'-' if r.back_s is None else f'{r.back_s:.1f}':>6}"
        )
        if r.busy_routes:
            spent = ", ".join(
                f"{route} {n} x {ms:.1f} ms"
                for route, (n, ms) in sorted(r.busy_routes.items(), key=lambda i: -i[1][0])
            )
            print(f"{'':>6} answered during the placements with the fleet: {spent}")
        if r.gc_pauses:
            each = "; ".join(
                f"server {n}: {count} pauses, {total:.2f} s in all, longest {1000 * longest:.0f} ms"
                for n, (count, total, longest, _) in enumerate(r.gc_pauses)
            )
            print(f"{'':>6} GC pauses: {each}")
            print(
                f"{'':>6} GC pauses over {1000 * SLOW_PAUSE_S:.0f} ms in the steady window, "
                f"per server: {r.slow_pauses_steady}"
            )
        if r.sla_ms:
            print(
                f"{'':>6} SLA reports: {len(r.sla_ms)}, p50 {q(r.sla_ms, 50)} ms, "
                f"p99 {q(r.sla_ms, 99)} ms; in the steady window {len(r.sla_steady_ms)}, "
                f"p50 {q(r.sla_steady_ms, 50)} ms, p99 {q(r.sla_steady_ms, 99)} ms"
            )
        if r.errors:
            print(f"{'':>6} errors: {r.errors}")
        if r.unanswered:
            print(f"{'':>6} not answered (a server down or restarting): {r.unanswered}")


def plot(results: list[Result], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cpu, wake) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key in sorted({(r.build, r.backend) for r in results}):
        rows = sorted((r for r in results if (r.build, r.backend) == key), key=lambda r: r.hosts)
        label = f"{key[0]}, {key[1]}"
        cpu.plot([r.hosts for r in rows], [r.idle_cpu_pct for r in rows], "o-", label=label)
        points = [
            (r.hosts, float(np.percentile(r.wake_other_ms or r.wake_ms, 99)))
            for r in rows
            if r.wake_other_ms or r.wake_ms
        ]
        if points:
            wake.plot(*zip(*points, strict=True), "o-", label=label)
    cpu.axhline(50, color="grey", lw=0.8, ls="--")
    cpu.set(xscale="log", xlabel="hosts (agents)", ylabel="% of one core", title="Idle server CPU")
    wake.axhline(100, color="grey", lw=0.8, ls="--")
    wake.set(
        xscale="log",
        yscale="log",
        xlabel="hosts (agents)",
        ylabel="ms",
        title="Claim to agent woken, p99 (other server on PostgreSQL)",
    )
    for ax in (cpu, wake):
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(machine(), fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"plot: {png}")


def main() -> None:
    if sys.argv[1:3] == ["--worker", "prepare"]:
        url, hosts, vms = sys.argv[3:]
        print(json.dumps({"uuids": prepare_here(url, int(hosts), int(vms))}))
        return
    # Not at the top: ``--worker prepare`` runs with the baseline's loadmaster, which
    # has no such setting.
    from loadmaster.agent.manager.host_manager import DEFAULT_WAIT_S

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"])
    # Longer than the longest wait (DEFAULT_WAIT_S), so that every agent's poll ends in it
    # at least once: a shorter window after the fleet settles sees fewer than the steady
    # number of polls ending (none at all at 1,000 hosts, whose first polls all began
    # within 3 s), and understates the idle cost.
    parser.add_argument("--idle", type=float, default=DEFAULT_WAIT_S + 10)
    parser.add_argument("--placements", type=int, default=200)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--baseline-hosts", type=int, nargs="*", default=[200, 1000])
    parser.add_argument("--baseline-ref", default=ISSUE_START)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--png", type=Path, default=ROOT / "bench/out/fleet.png")
    parser.add_argument(
        "--cold-start", action="store_true", help="every agent starts within 5 s, after=-1"
    )
    parser.add_argument(
        "--sla-every", type=float, default=0.0, help="each agent's SLA loop reports this often"
    )
    args = parser.parse_args()
    if args.sla_every < 0:
        parser.error("--sla-every: seconds between reports, 0 (none) or more")
    from loadmaster.api.server import raise_open_files_limit

    raise_open_files_limit()
    print(machine())
    results = []
    with tempfile.TemporaryDirectory(prefix="loadmaster-fleet-") as tmp:
        work = Path(tmp)
        runs = [(Build("current"), b, h) for h in args.hosts for b in args.backends]
        if not args.no_baseline:
            pythonpath = checkout(args.baseline_ref, work / "baseline")
            old = Build(f"baseline {args.baseline_ref}", pythonpath, legacy=True)
            runs = [(old, "sqlite", h) for h in args.baseline_hosts] + runs
        try:
            for build, backend, hosts in runs:
                started = time.monotonic()
                results.append(run(args, build, backend, hosts, work))
                report(results[-1:])  # as it comes: a run cut short keeps the others
                print(
                    f"  {build.name}, {backend}, {hosts} hosts: {time.monotonic() - started:.0f} s "
                    f"({machine()})",
                    flush=True,
                )
        finally:
            if not args.no_baseline:
                remove_checkout(work / "baseline")
    report(results)
    plot(results, args.png)


if __name__ == "__main__":
    main()
