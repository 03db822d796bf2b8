"""``GET /allocation_candidates`` over HTTP at 1,000 and 10,000 hosts (issues #12, #25).

Usage: .venv/bin/python bench/candidates.py [--hosts 1000 10000] [--requests 20]
                                           [--workload flat trees]
                                           [--baseline-ref REF | --no-baseline]

The cluster is Placement's benchmark's: per host VCPU 64 at ratio 4.0, MEMORY_MB 262,144
with 4,096 reserved, DISK_GB 2,000, CUSTOM_GPU 4 on 10 % of the hosts; a fifth of the
hosts hold pending claims (VMs placed, not started), which every answer counts as used.
The request is ``resources=VCPU:4,MEMORY_MB:8192,DISK_GB:40`` with no limit (every host
is a candidate), then with ``limit=50`` as Nova asks. One ``loadmaster serve`` worker on
SQLite; medians and p95 of ``--requests`` calls after one warm-up. OpenStack Placement
measured on this machine: about 176 ms at 1,000 hosts and 640 ms at 5,000.

The ``trees`` workload (issue #25) is Nova's NUMA-and-shared-storage layout: each host a
compute node without inventory of its own and two NUMA children (VCPU 32 at ratio 4.0,
MEMORY_MB 131,072 each, the second with ``HW_CPU_X86_AVX512F``), and one sharing provider
(DISK_GB 100,000, ``MISC_SHARES_VIA_AGGREGATE``) per 100 hosts in their aggregate. Its
queries: the same resources (every NUMA combination of each host: 4 candidates a host),
the same with ``required=HW_CPU_X86_AVX512F`` (the combinations that take VCPU or memory
from the second node: 3 a host), and with ``limit=50``. Each line prints how many candidates the query gave.

Two builds run side by side on the same cluster: this checkout and ``--baseline-ref``
(default: the commit issue #25 starts from, whose tree search gave one candidate a tree).
Each build builds its own database with its own code, then serves it; the ratio column is
current / baseline of the medians. The CPU model and load average are printed with each row.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from harness import ServedApi, checkout, machine, remove_checkout, run_worker  # noqa: E402
from single_placement import FLAVOR, Build, host_spec  # noqa: E402

ISSUE_START = "2f2a0d7"

QUERY = {"resources": "VCPU:4,MEMORY_MB:8192,DISK_GB:40"}
QUERIES = {
    "flat": (("all", QUERY), ("limit=50", {**QUERY, "limit": 50})),
    "trees": (
        ("all", QUERY),
        ("AVX512F", {**QUERY, "required": "HW_CPU_X86_AVX512F"}),
        ("limit=50", {**QUERY, "limit": 50}),
    ),
}
HOSTS_PER_SHARE = 100


def build(db: str, hosts: int) -> None:
    import loadmaster
    from loadmaster.cluster import VmSpec
    from loadmaster.scheduler import RequestSpec

    lm = loadmaster.open(db)
    lm.resource_classes.create("CUSTOM_GPU", kind="accelerator", unit="gpu")
    for first in range(0, hosts, 5000):
        lm.hosts.create_many([host_spec(i) for i in range(first, min(hosts, first + 5000))])
    lm.flavors.create({"name": "bench", "resources": FLAVOR})
    vms = [
        v.uuid for v in lm.vms.create_many([VmSpec(f"vm-{i}", "bench") for i in range(hosts // 5)])
    ]
    lm.scheduler.schedule([RequestSpec(vms=vms)], policy="spread")
    lm.close()


def build_trees(db: str, hosts: int) -> None:
    """Compute nodes with two NUMA children each, and a sharing disk per 100 hosts."""
    import loadmaster

    lm = loadmaster.open(db)
    aggregate = [str(uuid.uuid4()) for _ in range(0, hosts, HOSTS_PER_SHARE)]
    for k, agg in enumerate(aggregate):
        lm.hosts.create(
            f"share-{k:04d}",
            traits=["MISC_SHARES_VIA_AGGREGATE"],
            aggregates=[agg],
            inventories={"DISK_GB": {"total": 100_000}},
        )
    roots = lm.hosts.create_many(
        [
            {"name": f"cn-{i:06d}", "aggregates": [aggregate[i // HOSTS_PER_SHARE]]}
            for i in range(hosts)
        ]
    )
    numa = {"VCPU": {"total": 32, "allocation_ratio": 4.0}, "MEMORY_MB": {"total": 131_072}}
    for root in roots:
        for node in range(2):
            lm.hosts.create(
                f"{root.name}-numa{node}",
                parent=root.uuid,
                inventories=numa,
                traits=["HW_CPU_X86_AVX512F"] if node else [],
            )
    lm.close()


BUILDERS = {"flat": build, "trees": build_trees}


def measure(api: ServedApi, params: dict[str, object], requests: int) -> tuple[int, list[float]]:
    """How many candidates the query gives, and the seconds each of ``requests`` calls took
    after one warm-up call."""
    with api.client(timeout=300) as http:
        http.get("/allocation_candidates", params=params).raise_for_status()
        times = []
        count = 0
        for _ in range(requests):
            started = time.perf_counter()
            answer = http.get("/allocation_candidates", params=params)
            times.append(time.perf_counter() - started)
            answer.raise_for_status()
            count = len(answer.json()["allocation_requests"])
    return count, times


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        # The database is built by the build under test, with its own schema and code.
        _, workload, hosts, db = sys.argv[1:]
        BUILDERS[workload](db, int(hosts))
        print(json.dumps({"built": db}))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--workload", nargs="+", choices=tuple(QUERIES), default=list(QUERIES))
    parser.add_argument("--baseline-ref", default=ISSUE_START)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lm-candidates-"))
    builds = [Build("current", str(ROOT / "src"))]
    if not args.no_baseline:
        baseline = checkout(args.baseline_ref, work / "baseline")
        builds.insert(0, Build(f"baseline {args.baseline_ref}", baseline))
    print(
        f"{'workload':>8} {'hosts':>7} {'query':>10} {'build':>16} {'candidates':>11} "
        f"{'median ms':>10} {'p95 ms':>8} {'x baseline':>10}  machine"
    )
    try:
        for workload, hosts in itertools.product(args.workload, args.hosts):
            medians: dict[str, float] = {}
            for n, build_ in enumerate(builds):
                db = f"sqlite:///{work / f'{workload}{hosts}-{n}.db'}"
                run_worker(__file__, workload, str(hosts), db, env=build_.env(), label=build_.name)
                with ServedApi(db, 1, env=build_.env()) as api:
                    for label, params in QUERIES[workload]:
                        count, times = measure(api, params, args.requests)
                        median = statistics.median(times) * 1000
                        base = medians.setdefault(label, median)
                        print(
                            f"{workload:>8} {hosts:>7,} {label:>10} {build_.name:>16} "
                            f"{count:>11,} {median:>10.0f} "
                            f"{float(np.percentile(times, 95)) * 1000:>8.0f} "
                            f"{median / base:>10.2f}  {machine()}",
                            flush=True,
                        )
    finally:
        if not args.no_baseline:
            remove_checkout(work / "baseline")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
