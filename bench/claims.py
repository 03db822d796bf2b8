"""Claims per second through the ledger, on SQLite and on a real PostgreSQL.

Usage: .venv/bin/python bench/claims.py [--vms 2000] [--hosts 200] [--pg-url URL]
Without --pg-url (or LOADMASTER_TEST_PG_URL) a throw-away server is started with
scripts/postgres.sh. Each figure is measured in this run; the batch figure is the same
work in claim_many transactions of 100, shown as a ratio to one claim per transaction.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.pending import Claim

ROOT = Path(__file__).resolve().parents[1]


def build(url: str, hosts: int, vms: int) -> tuple[loadmaster.Loadmaster, list[str], list[str]]:
    lm = loadmaster.open(url)
    names = [f"host-{i:05d}" for i in range(hosts)]
    for name in names:
        lm.hosts.create(
            name,
            inventories={
                "VCPU": {"total": 64, "allocation_ratio": 4.0},
                "MEMORY_MB": {"total": 512 * 1024, "reserved": 4096},
            },
        )
    lm.flavors.create({"name": "m1.small", "resources": {"VCPU": 2, "MEMORY_MB": 4096}})
    uuids = [
        v.uuid for v in lm.vms.create_many([VmSpec(f"vm-{i}", "m1.small") for i in range(vms)])
    ]
    return lm, names, uuids


def measure(url: str, hosts: int, vms: int, label: str) -> None:
    lm, names, uuids = build(url, hosts, vms)
    half = len(uuids) // 2
    start = time.perf_counter()
    for i, vm in enumerate(uuids[:half]):
        lm.allocations.claim(vm, names[i % len(names)])
    single = half / (time.perf_counter() - start)
    start = time.perf_counter()
    rest = uuids[half:]
    for chunk in range(0, len(rest), 100):
        lm.allocations.claim_many(
            [
                Claim(vm, names[(chunk + j) % len(names)])
                for j, vm in enumerate(rest[chunk : chunk + 100])
            ]
        )
    batched = len(rest) / (time.perf_counter() - start)
    lm.close()
    print(
        f"{label:10s} one claim per transaction: {single:8.0f} claims/s   "
        f"claim_many(100): {batched:8.0f} claims/s   ratio {batched / single:5.1f}x"
    )


def fresh_pg_database(server: str) -> str:
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("DROP DATABASE IF EXISTS lm_bench"))
        conn.execute(text("CREATE DATABASE lm_bench"))
    admin.dispose()
    return server.rsplit("/", 1)[0] + "/lm_bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vms", type=int, default=2000)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--pg-url", default=os.environ.get("LOADMASTER_TEST_PG_URL"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        measure(f"sqlite:///{tmp}/bench.db", args.hosts, args.vms, "SQLite")
        server, pgdir = args.pg_url, None
        if server is None:
            pgdir = tempfile.mkdtemp(prefix="loadmaster-bench-pg-")
            server = subprocess.check_output(
                ["bash", str(ROOT / "scripts/postgres.sh"), "start", pgdir, "25433"], text=True
            ).strip()
        try:
            measure(fresh_pg_database(server), args.hosts, args.vms, "PostgreSQL")
        finally:
            if pgdir:
                subprocess.run(
                    ["bash", str(ROOT / "scripts/postgres.sh"), "stop", pgdir], check=False
                )


if __name__ == "__main__":
    main()
