"""One VM at a time: single placements, each persisted before the next (issue #11).

Usage: .venv/bin/python bench/single_placement.py [--hosts 1000 10000 100000] [--vms 200]
       [--rounds 3] [--modes inprocess http-sqlite http-pg http-pg-4] [--clients 4]
       [--baseline-ref REF] [--png bench/out/single_placement.png]

The workload is OpenStack Placement's own benchmark's: per host VCPU 64 at ratio 4.0,
MEMORY_MB 262,144 with 4,096 reserved, DISK_GB 2,000, and CUSTOM_GPU 4 on 10 % of the
hosts; ``--vms`` placements of {VCPU 4, MEMORY_MB 8,192, DISK_GB 40}, one VM per call.

Two builds run side by side: this checkout (``current``) and ``--baseline-ref`` (default:
the commit issue #27 starts from), checked out into a temporary git worktree and imported
through ``PYTHONPATH`` with the same virtual environment. Each build makes its own template
database per host count (its schema may differ); every round starts from a copy of it.
Rounds interleave the builds (baseline, current, baseline, ...), so the noise of this
2-core machine falls on both alike; figures are medians over rounds.

Modes:
- ``inprocess``: ``lm.scheduler.schedule`` with one VM per call in one process (the
  scheduler's snapshot is loaded once first, shown apart as ``load``).
- ``http-sqlite``: ``loadmaster serve --workers 1`` on SQLite, ``--clients`` client
  processes each sending ``POST /schedule`` for one VM at a time.
- ``http-operator``: as ``http-sqlite``, but each client does what an operator's tool
  does instead of ``POST /schedule``: ``POST /vms``, then ``POST /vms/{uuid}/start``
  (issue #27: each within 1.5x of ``POST /schedule``); both are timed apart and compared
  with ``http-sqlite`` of the same build and host count.
- ``http-pg`` / ``http-pg-4``: the same on PostgreSQL (a private server started here),
  with one and with four workers.

Printed: the setup rate (hosts/s through ``create_many``, and host registration over HTTP
one by one: loadmaster's ``POST /hosts`` and Placement's ``POST /resource_providers`` +
``PUT .../inventories``), placements/s, the median and p99 per placement, 409s per 1,000
placements, the peak RSS of the scheduling process, the ratio current / baseline, and the
load average as each round ended; the CPU model and load before and after. The
curve of cost per placement against the number of hosts is plotted to ``--png``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
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

from harness import (  # noqa: E402
    PrivatePostgres,
    ServedApi,
    checkout,
    machine,
    remove_checkout,
    run_worker,
)

# The commit issue #27's redesign (the claim path without the ORM, ...) starts from;
# issue #11's was 18f1891.
ISSUE_START = "47dac6a"
FLAVOR = {"VCPU": 4, "MEMORY_MB": 8192, "DISK_GB": 40}
CREATE_CHUNK = 5000
# Client processes are started this long before they all begin.
CLIENT_START_S = 3.0
MODES = ("inprocess", "http-sqlite", "http-operator", "http-pg", "http-pg-4")


# -- the worker side: runs under either build's PYTHONPATH -------------------------------
def host_spec(i: int) -> dict[str, Any]:
    inventories: dict[str, dict[str, Any]] = {
        "VCPU": {"total": 64, "allocation_ratio": 4.0},
        "MEMORY_MB": {"total": 262_144, "reserved": 4096},
        "DISK_GB": {"total": 2000},
    }
    if i % 10 == 0:
        inventories["CUSTOM_GPU"] = {"total": 4}
    return {"name": f"host-{i:06d}", "inventories": inventories}


def worker_build(db: str, hosts: int, vms: int) -> dict[str, Any]:
    import loadmaster
    from loadmaster.cluster import VmSpec

    lm = loadmaster.open(db)
    lm.resource_classes.create("CUSTOM_GPU", kind="accelerator", unit="gpu")
    started = time.perf_counter()
    for first in range(0, hosts, CREATE_CHUNK):
        lm.hosts.create_many([host_spec(i) for i in range(first, min(hosts, first + CREATE_CHUNK))])
    seconds = time.perf_counter() - started
    lm.flavors.create({"name": "bench", "resources": FLAVOR})
    lm.vms.create_many([VmSpec(f"vm-{i}", "bench") for i in range(vms)])
    # Closed, so that SQLite folds the write-ahead log into the file the rounds copy.
    lm.close()
    return {"hosts_per_s": hosts / seconds}


def worker_inprocess(db: str) -> dict[str, Any]:
    import loadmaster
    from loadmaster.scheduler import RequestSpec

    try:
        from loadmaster.runtime import settle_heap
    except ImportError:  # a build before it (the baseline): its serve froze the heap
        settle_heap = gc.freeze

    lm = loadmaster.open(db)
    uuids = [v.uuid for v in lm.vms.list() if v.state == "requested"]
    started = time.perf_counter()
    lm.scheduler.refresh()
    load = time.perf_counter() - started
    settle_heap()  # as ``serve`` and its scheduling process do once loaded
    latencies = []
    placed = 0
    started = time.perf_counter()
    for uuid in uuids:
        t0 = time.perf_counter()
        result = lm.scheduler.schedule([RequestSpec(vms=[uuid])])
        latencies.append(time.perf_counter() - t0)
        placed += len(result.placed)
    seconds = time.perf_counter() - started
    # Closed, so SQLite folds its write-ahead log back: a frozen heap is not collected
    # at exit, and a log left behind beside the next round's copy corrupts it.
    lm.close()
    return {
        "seconds": seconds,
        "latencies": latencies,
        "placed": placed,
        "conflicts": 0,
        "load_seconds": load,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def worker_client(
    url: str, token: str, uuids: list[str], start_at: float, operator: bool
) -> dict[str, Any]:
    """One VM per request from ``start_at`` (wall clock, so that every client process,
    started one after the other, begins together); when the last answer came.
    ``operator``: what an operator's tool (Nova, openstacksdk, the CLI) does instead of
    ``POST /schedule``: ``POST /vms`` to create the VM, then ``POST /vms/{uuid}/start``;
    each is timed apart, and a placement's latency is the two together."""
    from loadmaster.microversions import CLIENT_HEADERS

    headers = {**CLIENT_HEADERS, "Authorization": f"Bearer {token}"}
    latencies: list[float] = []
    steps: dict[str, list[float]] = {"create": [], "start": []}
    statuses: Counter[int] = Counter()
    placed = 0
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        time.sleep(max(0.0, start_at - time.time()))
        for uuid in uuids:
            t0 = time.perf_counter()
            if operator:
                made = http.post("/vms", json={"name": f"op-{uuid}", "flavor": "bench"})
                t1 = time.perf_counter()
                statuses[made.status_code] += 1
                answer = http.post(f"/vms/{made.json()['uuid']}/start")
                steps["create"].append(t1 - t0)
                steps["start"].append(time.perf_counter() - t1)
                placed += answer.status_code == 200 and bool(answer.json()["placement"]["host"])
            else:
                answer = http.post("/schedule", json={"requests": [{"vms": [uuid]}]})
                if answer.status_code == 200:
                    placed += sum(1 for p in answer.json()["placements"] if p.get("host"))
            latencies.append(time.perf_counter() - t0)
            statuses[answer.status_code] += 1
    return {
        "latencies": latencies,
        "steps": steps,
        "placed": placed,
        "statuses": dict(statuses),
        "ended": time.time(),
    }


def worker_register(url: str, token: str, count: int) -> dict[str, Any]:
    """Hosts registered one request at a time: loadmaster's ``POST /hosts`` (inventories
    in the body); ten times as many in requests of 1,000 (``POST /bulk/hosts``); then
    Placement's two calls per provider."""
    from loadmaster.microversions import CLIENT_HEADERS

    headers = {**CLIENT_HEADERS, "Authorization": f"Bearer {token}"}
    rates = {}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        http.put("/resource_classes/CUSTOM_GPU").raise_for_status()
        started = time.perf_counter()
        for i in range(count):
            spec = host_spec(i)
            spec["name"] = f"reg-{i}"
            http.post("/hosts", json=spec).raise_for_status()
        rates["loadmaster POST /hosts"] = count / (time.perf_counter() - started)
        # A cloud's registration in requests of 1,000 hosts.
        bulk = 10 * count
        started = time.perf_counter()
        for first in range(0, bulk, 1000):
            batch = []
            for i in range(first, min(first + 1000, bulk)):
                spec = host_spec(i)
                spec["name"] = f"bulk-{i}"
                batch.append(spec)
            answer = http.post("/bulk/hosts", json={"hosts": batch})
            if answer.status_code in (404, 405):  # a build from before the bulk route
                break
            answer.raise_for_status()
        else:
            rates["loadmaster POST /bulk/hosts (1,000 a request)"] = bulk / (
                time.perf_counter() - started
            )
        started = time.perf_counter()
        for i in range(count):
            spec = host_spec(i)
            made = http.post("/resource_providers", json={"name": f"placement-{i}"})
            made.raise_for_status()
            provider = made.json()
            http.put(
                f"/resource_providers/{provider['uuid']}/inventories",
                json={
                    "resource_provider_generation": provider["generation"],
                    "inventories": spec["inventories"],
                },
            ).raise_for_status()
        rates["Placement POST + PUT inventories"] = count / (time.perf_counter() - started)
    return rates


def worker_main(argv: list[str]) -> None:
    kind, *rest = argv
    if kind == "build":
        out = worker_build(rest[0], int(rest[1]), int(rest[2]))
    elif kind == "inprocess":
        out = worker_inprocess(rest[0])
    elif kind == "client":
        out = worker_client(
            rest[0], rest[1], rest[2].split(","), float(rest[3]), rest[4] == "operator"
        )
    elif kind == "register":
        out = worker_register(rest[0], rest[1], int(rest[2]))
    else:
        raise SystemExit(f"unknown worker {kind!r}")
    print(json.dumps(out))


# -- the orchestrator -----------------------------------------------------------------------
@dataclass
class Build:
    name: str
    pythonpath: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": self.pythonpath}

    def run(self, *args: str) -> dict[str, Any]:
        return run_worker(__file__, *args, env=self.env(), label=f"{self.name} ")


@dataclass
class Run:
    seconds: float
    latencies: list[float]
    placed: int
    conflicts: int
    peak_rss_mib: float
    load_seconds: float = 0.0
    # The operator's cycle: "create" and "start" latencies apart.
    steps: dict[str, list[float]] = field(default_factory=dict)
    # The machine's load average over the last minute as the run ended.
    loadavg: float = field(
        default_factory=lambda: float(Path("/proc/loadavg").read_text().split()[0])
    )


@dataclass
class Cell:
    runs: list[Run] = field(default_factory=list)

    def rate(self) -> float:
        return statistics.median(r.placed / r.seconds for r in self.runs)

    def quantile_ms(self, q: float) -> float:
        return statistics.median(float(np.percentile(r.latencies, q)) * 1000 for r in self.runs)

    def conflicts_per_1000(self) -> float:
        placed = sum(r.placed for r in self.runs)
        return 1000 * sum(r.conflicts for r in self.runs) / placed if placed else 0.0

    def rss(self) -> float:
        return max(r.peak_rss_mib for r in self.runs)

    def load(self) -> float:
        return statistics.median(r.load_seconds for r in self.runs)

    def loadavg(self) -> str:
        values = [r.loadavg for r in self.runs]
        return f"{min(values):.1f}-{max(values):.1f}"

    def step_ms(self, step: str, q: float) -> float:
        return statistics.median(
            float(np.percentile(r.steps[step], q)) * 1000 for r in self.runs if r.steps
        )


def http_round(
    build: Build,
    db_url: str,
    workers: int,
    uuids: list[str],
    clients: int,
    log: Path,
    operator: bool = False,
) -> Run:
    with ServedApi(db_url, workers, log_path=log, env=build.env()) as api:
        with api.client() as http:
            # The first call loads the scheduler's snapshot: not a placement, kept apart.
            started = time.perf_counter()
            http.post(
                "/schedule",
                json={"requests": [{"flavor": "bench", "count": 1}], "dry_run": True},
            ).raise_for_status()
            load = time.perf_counter() - started
        shares = [",".join(uuids[i::clients]) for i in range(clients)]
        # Timed from one instant all clients wait for, not from the first process's start:
        # a client process takes about half a second to start, as long as the work itself.
        start_at = time.time() + CLIENT_START_S
        with ThreadPoolExecutor(clients) as pool:
            outs = list(
                pool.map(
                    lambda share: build.run(
                        "client",
                        api.url,
                        api.token,
                        share,
                        str(start_at),
                        "operator" if operator else "schedule",
                    ),
                    shares,
                )
            )
        seconds = max(out["ended"] for out in outs) - start_at
        rss = max(_peak_rss_mib(pid) for pid in api.worker_pids())
    statuses: Counter[str] = Counter()
    for out in outs:
        statuses.update(out["statuses"])
    steps = {
        step: [x for out in outs for x in out.get("steps", {}).get(step, [])]
        for step in ("create", "start")
    }
    return Run(
        seconds,
        [x for out in outs for x in out["latencies"]],
        sum(out["placed"] for out in outs),
        statuses.get("409", 0),
        rss,
        load,
        steps if operator else {},
    )


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def vm_uuids(db_url: str) -> list[str]:
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT uuid FROM vms WHERE state = 'requested' ORDER BY id"))
        uuids = [r[0] for r in rows]
    engine.dispose()
    return uuids


def pg_database(admin_url: str, name: str, template: str | None = None) -> str:
    """A new database ``name`` (a copy of ``template`` if given); its URL."""
    from sqlalchemy import create_engine, text

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        copy = f' TEMPLATE "{template}"' if template else ""
        conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
    engine.dispose()
    return admin_url.rsplit("/", 1)[0] + "/" + name


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--vms", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--register", type=int, default=300, help="hosts registered over HTTP")
    parser.add_argument("--baseline-ref", default=ISSUE_START)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--png", type=Path, default=ROOT / "bench/out/single_placement.png")
    args = parser.parse_args()

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(width=200)
    console.print(machine())
    work = Path(tempfile.mkdtemp(prefix="lm-single-"))
    builds = [Build("current", str(ROOT / "src"))]
    if not args.no_baseline:
        baseline = checkout(args.baseline_ref, work / "baseline")
        builds.insert(0, Build(f"baseline {args.baseline_ref}", baseline))
    pg = PrivatePostgres() if any(m.startswith("http-pg") for m in args.modes) else None
    cells: dict[tuple[int, str, str], Cell] = {}
    setup: dict[tuple[int, str], float] = {}
    registration: dict[str, dict[str, float]] = {}
    try:
        total = len(args.hosts) * args.rounds * len(builds) * len(args.modes)
        with Progress(console=console) as progress:
            task = progress.add_task("single placements", total=total)
            for build in builds:
                api_db = f"sqlite:///{work / f'register-{build.name[:8]}.db'}"
                with ServedApi(api_db, 1, env=build.env()) as api:
                    registration[build.name] = build.run(
                        "register", api.url, api.token, str(args.register)
                    )
            for hosts in args.hosts:
                templates: dict[tuple[str, str], str] = {}
                for n, build in enumerate(builds):
                    progress.update(task, description=f"{hosts} hosts: building ({build.name})")
                    sqlite_file = work / f"template-{n}-{hosts}.db"
                    out = build.run("build", f"sqlite:///{sqlite_file}", str(hosts), str(args.vms))
                    setup[(hosts, build.name)] = out["hosts_per_s"]
                    templates[(build.name, "sqlite")] = str(sqlite_file)
                    if pg is not None:
                        name = f"tmpl_{n}_{hosts}"
                        build.run("build", pg_database(pg.url, name), str(hosts), str(args.vms))
                        templates[(build.name, "pg")] = name
                for round_ in range(args.rounds):
                    for n, build in enumerate(builds):
                        for mode in args.modes:
                            progress.update(
                                task,
                                description=f"{hosts} hosts, round {round_ + 1}: {mode} ({build.name})",
                            )
                            if mode.startswith("http-pg"):
                                assert pg is not None
                                url = pg_database(pg.url, f"run_{n}", templates[(build.name, "pg")])
                            else:
                                copy = work / f"run-{n}.db"
                                for stale in (f"{copy}-wal", f"{copy}-shm"):
                                    Path(stale).unlink(missing_ok=True)
                                shutil.copyfile(templates[(build.name, "sqlite")], copy)
                                url = f"sqlite:///{copy}"
                            if mode == "inprocess":
                                out = build.run("inprocess", url)
                                run = Run(
                                    out["seconds"],
                                    out["latencies"],
                                    out["placed"],
                                    0,
                                    out["peak_rss_mib"],
                                    out["load_seconds"],
                                )
                            else:
                                workers = 4 if mode == "http-pg-4" else 1
                                run = http_round(
                                    build,
                                    url,
                                    workers,
                                    vm_uuids(url),
                                    args.clients,
                                    work / f"serve-{n}.log",
                                    operator=mode == "http-operator",
                                )
                            cells.setdefault((hosts, mode, build.name), Cell()).runs.append(run)
                            progress.advance(task)
    finally:
        if pg is not None:
            pg.close()
        if not args.no_baseline:
            remove_checkout(work / "baseline")
        shutil.rmtree(work, ignore_errors=True)

    reg = Table(title="Host registration over HTTP (SQLite, 1 worker)")
    reg.add_column("build")
    labels = list(dict.fromkeys(label for rates in registration.values() for label in rates))
    for label in labels:
        reg.add_column(f"{label} (hosts/s)", justify="right")
    for name, rates in registration.items():
        reg.add_row(name, *(f"{rates[k]:,.0f}" if k in rates else "-" for k in labels))
    console.print(reg)
    table = Table(
        title=f"Single placements: {args.vms} VMs one per call, medians of {args.rounds} rounds"
    )
    for column in (
        "hosts",
        "mode",
        "build",
        "setup hosts/s",
        "placements/s",
        "x baseline",
        "p50 ms",
        "p99 ms",
        "409/1000",
        "peak RSS MiB",
        "snapshot load s",
        "load average",
    ):
        table.add_column(column, justify="right")
    for (hosts, mode, name), cell in sorted(cells.items()):
        base = cells.get((hosts, mode, builds[0].name)) if len(builds) > 1 else None
        ratio = f"{cell.rate() / base.rate():.2f}" if base and base is not cell else "-"
        table.add_row(
            f"{hosts:,}",
            mode,
            name,
            f"{setup[(hosts, name)]:,.0f}",
            f"{cell.rate():,.0f}",
            ratio,
            f"{cell.quantile_ms(50):.1f}",
            f"{cell.quantile_ms(99):.1f}",
            f"{cell.conflicts_per_1000():.0f}",
            f"{cell.rss():,.0f}",
            f"{cell.load():.2f}",
            cell.loadavg(),
        )
    console.print(table)
    for (hosts, mode, name), cell in sorted(cells.items()):
        schedule = cells.get((hosts, "http-sqlite", name))
        if mode != "http-operator" or schedule is None:
            continue
        one = schedule.quantile_ms(50)
        console.print(
            f"{hosts:,} hosts, {name}: the operator's cycle, p50 POST /vms "
            f"{cell.step_ms('create', 50):.1f} ms ({cell.step_ms('create', 50) / one:.2f}x "
            f"POST /schedule's {one:.1f} ms), POST /vms/{{uuid}}/start "
            f"{cell.step_ms('start', 50):.1f} ms ({cell.step_ms('start', 50) / one:.2f}x); "
            f"p99 {cell.step_ms('create', 99):.1f} and {cell.step_ms('start', 99):.1f} ms "
            f"against {schedule.quantile_ms(99):.1f} ms"
        )
    console.print(machine())
    plot(cells, args.png)
    console.print(f"curve: {args.png}")


def plot(cells: dict[tuple[int, str, str], Cell], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for mode, name in sorted({(m, n) for _, m, n in cells}):
        points = sorted(
            (h, c.quantile_ms(50)) for (h, m, n), c in cells.items() if (m, n) == (mode, name)
        )
        ax.plot(*zip(*points, strict=True), marker="o", label=f"{mode} ({name})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("hosts")
    ax.set_ylabel("median ms per placement")
    ax.set_title("One VM per call, persisted: cost against the number of hosts")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
