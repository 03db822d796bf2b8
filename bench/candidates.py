"""``GET /allocation_candidates`` over HTTP at 1,000 and 10,000 hosts (issue #12).

Usage: .venv/bin/python bench/candidates.py [--hosts 1000 10000] [--requests 20]

The cluster is Placement's benchmark's: per host VCPU 64 at ratio 4.0, MEMORY_MB 262,144
with 4,096 reserved, DISK_GB 2,000, CUSTOM_GPU 4 on 10 % of the hosts; a fifth of the
hosts hold pending claims (VMs placed, not started), which every answer counts as used.
The request is ``resources=VCPU:4,MEMORY_MB:8192,DISK_GB:40`` with no limit (every host
is a candidate), then with ``limit=50`` as Nova asks. One ``loadmaster serve`` worker on
SQLite; medians and p95 of ``--requests`` calls after one warm-up. OpenStack Placement
measured on this machine: about 176 ms at 1,000 hosts and 640 ms at 5,000.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from harness import ServedApi  # noqa: E402
from single_placement import FLAVOR, host_spec  # noqa: E402

QUERY = {"resources": "VCPU:4,MEMORY_MB:8192,DISK_GB:40"}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    print(f"{'hosts':>7} {'query':>10} {'candidates':>11} {'median ms':>10} {'p95 ms':>8}")
    with tempfile.TemporaryDirectory() as work:
        for hosts in args.hosts:
            db = f"sqlite:///{Path(work) / f'c{hosts}.db'}"
            build(db, hosts)
            with ServedApi(db, 1) as api, api.client(timeout=120) as http:
                for label, params in (("all", QUERY), ("limit=50", {**QUERY, "limit": 50})):
                    http.get("/allocation_candidates", params=params).raise_for_status()
                    times = []
                    count = 0
                    for _ in range(args.requests):
                        started = time.perf_counter()
                        answer = http.get("/allocation_candidates", params=params)
                        times.append(time.perf_counter() - started)
                        answer.raise_for_status()
                        count = len(answer.json()["allocation_requests"])
                    print(
                        f"{hosts:>7,} {label:>10} {count:>11,} "
                        f"{statistics.median(times) * 1000:>10.0f} "
                        f"{float(np.percentile(times, 95)) * 1000:>8.0f}"
                    )


if __name__ == "__main__":
    main()
