"""Concurrency: ``loadmaster serve --workers N`` on PostgreSQL under several client
processes for a fixed time (issue #11's "Concurrency" target).

Usage: .venv/bin/python bench/concurrency.py [--hosts 10000] [--workers 1 4] [--clients 8]
       [--seconds 60] [--vms 40000] [--rounds 1] [--png bench/out/concurrency.png]

The workload is bench/single_placement.py's: per host VCPU 64 at ratio 4.0, MEMORY_MB
262,144 with 4,096 reserved, DISK_GB 2,000, CUSTOM_GPU 4 on 10 % of the hosts; a pool of
``--vms`` requested VMs of flavor {VCPU 4, MEMORY_MB 8,192, DISK_GB 40}. One template
database is built once on a private PostgreSQL; every run starts from a copy of it.

Per worker count (interleaved over ``--rounds``): ``serve --workers N`` on the copy, one
dry-run ``POST /schedule`` to load the scheduler's snapshot, then ``--clients`` client
processes, each with its own share of the pool, send ``POST /schedule`` for one VM at a time
from the same start instant until the same deadline. The server is stopped and the
database audited (``loadmaster.pending.audit``).

Printed, per worker count (medians over rounds; counts summed): requests, placements,
placements/s, p50 and p99 ms per request, 409s per 1,000 placements, claims decided again
(lost to another worker inside a call, not answered 409) per 1,000, other non-200
answers, the CPU spent per placement during the clients' window (by the server's
processes, by PostgreSQL's, and by the whole machine, clients included: on a machine the
run saturates, throughput is its cores over that last figure), the peak RSS of the
largest server worker, placements the database holds against
those the clients counted, and the audit's problems by kind. Then the ratio placements/s
at the most workers / at the fewest, and whether throughput rises with workers. Each run
also prints the requests per client (uneven when a worker holds fewer clients' connections;
a client whose share runs out before the deadline is reported: raise ``--vms``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from harness import PrivatePostgres, ServedApi, run_worker  # noqa: E402
from single_placement import _peak_rss_mib, pg_database, vm_uuids, worker_build  # noqa: E402

TEMPLATE = "conc_template"
START_DELAY_S = 3.0  # time for the client processes to start before the common start


# -- the client processes ---------------------------------------------------------------
def worker_client_for(job: dict[str, Any]) -> dict[str, Any]:
    """``POST /schedule`` one VM per request from ``job["start"]`` (wall clock) until
    ``job["deadline"]`` or the end of this client's share."""
    from loadmaster.microversions import CLIENT_HEADERS

    headers = {**CLIENT_HEADERS, "Authorization": f"Bearer {job['token']}"}
    uuids: list[str] = job["uuids"]
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    placed = retried = 0
    with httpx.Client(base_url=job["url"], headers=headers, timeout=60) as http:
        late = time.time() - job["start"]
        if late < 0:
            time.sleep(-late)
        started = time.perf_counter()
        deadline = started + (job["deadline"] - job["start"])
        for uuid in uuids:
            if time.perf_counter() >= deadline:
                break
            t0 = time.perf_counter()
            try:
                answer = http.post("/schedule", json={"requests": [{"vms": [uuid]}]})
            except httpx.TransportError as exc:
                statuses[type(exc).__name__] += 1
                continue
            finally:
                latencies.append(time.perf_counter() - t0)
            statuses[str(answer.status_code)] += 1
            if answer.status_code == 200:
                result = answer.json()
                placed += sum(1 for p in result["placements"] if p.get("host"))
                # Claims lost to another worker and decided again inside the call.
                retried += result["conflicts"]
        exhausted = time.perf_counter() < deadline
        seconds = time.perf_counter() - started
    return {
        "latencies": [round(x, 6) for x in latencies],
        "placed": placed,
        "retried": retried,
        "statuses": dict(statuses),
        "seconds": seconds,
        "late_s": max(late, 0.0),
        "exhausted": exhausted,
        "requests": len(latencies),
    }


def worker_main(argv: list[str]) -> None:
    kind, *rest = argv
    if kind == "build":
        started = time.perf_counter()
        out = worker_build(rest[0], int(rest[1]), int(rest[2]))
        out["seconds"] = time.perf_counter() - started
    elif kind == "client-for":
        out = worker_client_for(json.load(sys.stdin))
    else:
        raise SystemExit(f"unknown worker {kind!r}")
    print(json.dumps(out))


# -- the orchestrator -----------------------------------------------------------------------
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far: by the server's processes, by PostgreSQL's, and by the
    whole machine (busy, all cores)."""

    server: float
    postgres: float
    machine: float

    def __sub__(self, other: CpuSample) -> CpuSample:
        return CpuSample(
            self.server - other.server,
            self.postgres - other.postgres,
            self.machine - other.machine,
        )


def _process_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def cpu_sample(api: ServedApi) -> CpuSample:
    server = {api.process.pid, *api.worker_pids()}
    postgres = 0.0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes().startswith(b"postgres"):
                    postgres += _process_cpu(int(proc.name))
            except OSError:
                continue
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return CpuSample(
        sum(_process_cpu(pid) for pid in server),
        postgres,
        (user + nice + system + irq + softirq + steal) / TICK,
    )


@dataclass
class Run:
    seconds: float
    latencies: list[float]
    placed: int
    retried: int
    statuses: Counter[str]
    peak_rss_mib: float
    placed_in_db: int
    problems: Counter[str]
    late_s: float
    exhausted: bool
    per_client: list[int]
    # CPU used during the clients' window (start to deadline).
    cpu: CpuSample

    @property
    def rate(self) -> float:
        return self.placed / self.seconds


@dataclass
class Cell:
    runs: list[Run] = field(default_factory=list)

    def rate(self) -> float:
        return statistics.median(r.rate for r in self.runs)

    def quantile_ms(self, q: float) -> float:
        return statistics.median(float(np.percentile(r.latencies, q)) * 1000 for r in self.runs)

    def statuses(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.runs:
            total.update(r.statuses)
        return total

    def placed(self) -> int:
        return sum(r.placed for r in self.runs)

    def retried_per_1000(self) -> float:
        placed = self.placed()
        return 1000 * sum(r.retried for r in self.runs) / placed if placed else 0.0

    def cpu_ms_per_placement(self, part: str) -> float:
        return statistics.median(1000 * getattr(r.cpu, part) / r.placed for r in self.runs)

    def conflicts_per_1000(self) -> float:
        placed = self.placed()
        return 1000 * self.statuses().get("409", 0) / placed if placed else 0.0

    def problems(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.runs:
            total.update(r.problems)
        return total


def concurrent_round(
    url: str, workers: int, uuids: list[str], clients: int, seconds: float, log: Path
) -> Run:
    import loadmaster
    from loadmaster.pending import audit

    with ServedApi(url, workers, log_path=log) as api:
        with api.client() as http:
            # The first call loads the scheduler's snapshot: not a placement, kept apart.
            http.post(
                "/schedule",
                json={"requests": [{"flavor": "bench", "count": 1}], "dry_run": True},
            ).raise_for_status()
        start = time.time() + START_DELAY_S
        jobs = [
            json.dumps(
                {
                    "url": api.url,
                    "token": api.token,
                    "start": start,
                    "deadline": start + seconds,
                    "uuids": uuids[i::clients],
                }
            )
            for i in range(clients)
        ]
        with ThreadPoolExecutor(clients) as pool:
            running = pool.map(lambda job: run_worker(__file__, "client-for", stdin=job), jobs)
            time.sleep(max(0.0, start - time.time()))
            before = cpu_sample(api)
            time.sleep(max(0.0, start + seconds - time.time()))
            used = cpu_sample(api) - before
            outs = list(running)
        rss = max(_peak_rss_mib(pid) for pid in api.worker_pids())
    statuses: Counter[str] = Counter()
    for out in outs:
        statuses.update(out["statuses"])
    with loadmaster.open(url, migrate=False) as lm:
        problems = Counter(p.kind for p in audit(lm.store))
    return Run(
        seconds=max(out["seconds"] for out in outs),
        latencies=[x for out in outs for x in out["latencies"]],
        placed=sum(out["placed"] for out in outs),
        retried=sum(out["retried"] for out in outs),
        statuses=statuses,
        peak_rss_mib=rss,
        placed_in_db=len(uuids) - len(vm_uuids(url)),
        problems=problems,
        late_s=max(out["late_s"] for out in outs),
        exhausted=any(out["exhausted"] for out in outs),
        per_client=[out["requests"] for out in outs],
        cpu=used,
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--vms", type=int, default=40_000, help="requested VMs; more than the fastest run places"
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--logs", type=Path, default=ROOT / "bench/out/concurrency")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    args.logs.mkdir(parents=True, exist_ok=True)
    cells: dict[int, Cell] = {}
    with PrivatePostgres() as pg:
        console.print(f"building the template: {args.hosts:,} hosts, {args.vms:,} VMs ...")
        built = run_worker(
            __file__, "build", pg_database(pg.url, TEMPLATE), str(args.hosts), str(args.vms)
        )
        uuids = vm_uuids(pg.url.rsplit("/", 1)[0] + "/" + TEMPLATE)
        console.print(
            f"template: {built['hosts_per_s']:,.0f} hosts/s through create_many, "
            f"{len(uuids):,} requested VMs, built in {built['seconds']:.1f} s"
        )
        for round_ in range(args.rounds):
            for workers in args.workers:
                console.print(
                    f"round {round_ + 1}: --workers {workers}, {args.clients} clients, "
                    f"{args.seconds:g} s"
                )
                url = pg_database(pg.url, "conc_run", template=TEMPLATE)
                log = args.logs / f"serve-w{workers}-r{round_ + 1}.log"
                log.unlink(missing_ok=True)
                run = concurrent_round(url, workers, uuids, args.clients, args.seconds, log)
                cells.setdefault(workers, Cell()).runs.append(run)
                if run.late_s > 0:
                    console.print(f"  [yellow]a client started {run.late_s:.2f} s late")
                if run.exhausted:
                    console.print(
                        "  [yellow]a client ran out of VMs before the deadline: raise --vms"
                    )
                console.print(f"  requests per client: {run.per_client}")

    table = Table(
        title=f"Concurrency on PostgreSQL: {args.hosts:,} hosts, one VM per POST /schedule, "
        f"medians of {args.rounds} round(s)"
    )
    for column in (
        "workers",
        "clients",
        "seconds",
        "requests",
        "placements",
        "placements/s",
        "p50 ms",
        "p99 ms",
        "409/1000",
        "decided again/1000",
        "other non-200",
        "server CPU ms/placement",
        "PostgreSQL CPU ms/placement",
        "machine CPU ms/placement",
        "worker peak RSS MiB",
        "placed in DB",
        "audit",
    ):
        table.add_column(column, justify="right")
    for workers, cell in sorted(cells.items()):
        statuses = cell.statuses()
        other = {k: n for k, n in sorted(statuses.items()) if k not in ("200", "409")}
        problems = cell.problems()
        table.add_row(
            str(workers),
            str(args.clients),
            f"{statistics.median(r.seconds for r in cell.runs):.1f}",
            f"{sum(statuses.values()):,}",
            f"{cell.placed():,}",
            f"{cell.rate():,.1f}",
            f"{cell.quantile_ms(50):.1f}",
            f"{cell.quantile_ms(99):.1f}",
            f"{cell.conflicts_per_1000():.1f}",
            f"{cell.retried_per_1000():.1f}",
            ", ".join(f"{k}: {n}" for k, n in other.items()) or "none",
            f"{cell.cpu_ms_per_placement('server'):.2f}",
            f"{cell.cpu_ms_per_placement('postgres'):.2f}",
            f"{cell.cpu_ms_per_placement('machine'):.2f}",
            f"{max(r.peak_rss_mib for r in cell.runs):,.0f}",
            f"{sum(r.placed_in_db for r in cell.runs):,}",
            ", ".join(f"{k}: {n}" for k, n in sorted(problems.items())) or "clean",
        )
    console.print(table)

    problems_total = Counter[str]()
    for cell in cells.values():
        problems_total.update(cell.problems())
    if problems_total:
        console.print(
            "audit problems: " + ", ".join(f"{k}: {n}" for k, n in sorted(problems_total.items()))
        )
    else:
        console.print("audit clean")
    mismatched = [w for w, c in cells.items() if any(r.placed != r.placed_in_db for r in c.runs)]
    if mismatched:
        console.print(f"placements the clients counted differ from the database's: {mismatched}")
    fewest, most = min(cells), max(cells)
    if fewest != most:
        ratio = cells[most].rate() / cells[fewest].rate()
        console.print(f"placements/s at {most} workers / at {fewest}: {ratio:.2f}")
        console.print(f"throughput rises with workers: {'yes' if ratio > 1 else 'no'}")
    console.print(f"server logs: {args.logs}")
    if args.png is not None:
        plot(cells, args.png)
        console.print(f"plot: {args.png}")


def plot(cells: dict[int, Cell], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = sorted(cells)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(workers, [cells[w].rate() for w in workers], marker="o", label="placements/s")
    ax.set_xlabel("serve --workers")
    ax.set_ylabel("placements/s")
    ax.set_xticks(workers)
    ax.grid(True, alpha=0.3)
    latency = ax.twinx()
    latency.plot(
        workers, [cells[w].quantile_ms(50) for w in workers], marker="s", color="C1", label="p50"
    )
    latency.plot(
        workers, [cells[w].quantile_ms(99) for w in workers], marker="^", color="C2", label="p99"
    )
    latency.set_ylabel("ms per request")
    fig.legend(loc="upper left", fontsize=8)
    ax.set_title("POST /schedule, one VM per request, on PostgreSQL")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
