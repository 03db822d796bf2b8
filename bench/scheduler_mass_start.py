"""Mass start: 10,000 VMs placed and persisted (SQLite) on 1,000 / 5,000 / 10,000 hosts.

Usage: .venv/bin/python bench/scheduler_mass_start.py [--hosts 1000 5000 10000] [--vms 10000]
       [--baseline-vms 300] [--seed 7] [--groups mixed|anti-affinity-1000|affinity-10]

The cluster (seeded, so every run builds the same one):
- hosts in three generations: 32 / 48 / 64 cores, 128 / 256 / 384 GiB; VCPU allocation
  ratio 4.0, MEMORY_MB with 4096 reserved, DISK_GB 1-4 TB; 10% of the hosts have
  CUSTOM_GPU (4 each) and the trait CUSTOM_GPU_HOST.
- VM sizes: vCPU 1 (30%), 2 (35%), 4 (25%), 8 (8%), with 2 or 4 GiB per vCPU, capped to
  2-16 GiB for the small ones (so mostly 1-4 vCPU, 2-16 GiB); disk 20-80 GiB; 2% of the
  VMs ask for one GPU.
- Server groups: anti-affinity groups of 3-50 members, about 20% of the VMs.

The scheduler places all VMs in one ``schedule`` call (best effort, ``spread`` policy,
claims persisted in chunks). The naive baseline is what a first version would do: a Python
loop over every host per VM over dicts (no numpy index), with the same filters and spread
score and the same chunked claims; it runs on a fresh copy of the cluster with
``--baseline-vms`` VMs, and its rate is extrapolated to the full count (said so in the
output). Constraint violations are recomputed from the store afterwards: allocated above
capacity, two members of an anti-affinity group on one host, and the ledger audit.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.pending import Claim, audit
from loadmaster.runtime import settle_heap
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster

console = Console(width=180)
CHUNK = 500


@dataclass
class Figures:
    label: str
    vms: int
    placed: int
    seconds: float
    latencies: list[float]
    violations: int
    peak_mib: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.placed / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1000 if self.latencies else 0.0


# --groups: the mixed cloud above, or every VM in a hard group of one size.
GROUP_SCENARIOS: dict[str, tuple[str, int] | None] = {
    "mixed": None,
    "anti-affinity-1000": ("anti-affinity", 1000),
    "affinity-10": ("affinity", 10),
}


def build(
    url: str, hosts: int, vms: int, seed: int, progress: Progress, scenario: str = "mixed"
) -> tuple[Loadmaster, list[str]]:
    rng = np.random.default_rng(seed)
    lm = loadmaster.open(url)
    lm.resource_classes.create("CUSTOM_GPU", kind="accelerator", unit="gpu")
    lm.traits.create("CUSTOM_GPU_HOST")
    task = progress.add_task(f"building {hosts} hosts", total=2)
    specs = []
    for i in range(hosts):
        cores, mem_gib = [(32, 128), (48, 256), (64, 384)][i % 3]
        gpu = i % 10 == 0
        inventories: dict[str, dict[str, object]] = {
            "VCPU": {"total": cores, "allocation_ratio": 4.0},
            "MEMORY_MB": {"total": mem_gib * 1024, "reserved": 4096},
            "DISK_GB": {"total": int(rng.integers(1000, 4001))},
        }
        if gpu:
            inventories["CUSTOM_GPU"] = {"total": 4}
        specs.append(
            {
                "name": f"host-{i:05d}",
                "inventories": inventories,
                "traits": ["CUSTOM_GPU_HOST"] if gpu else [],
                "aggregates": [f"rack-{i // 40}"],
            }
        )
    lm.hosts.create_many(specs)
    progress.advance(task)
    flavors: set[str] = set()
    vm_specs = []
    group_left = 0
    group = None
    groups = 0
    for i in range(vms):
        vcpu = int(rng.choice([1, 2, 4, 8], p=[0.30, 0.35, 0.25, 0.10]))
        mem = min(max(vcpu * int(rng.choice([2, 4])), 2), 16 if vcpu <= 4 else 32) * 1024
        disk = int(rng.choice([20, 40, 80]))
        gpu = rng.random() < 0.02
        name = f"v{vcpu}-m{mem}-d{disk}" + ("-gpu" if gpu else "")
        if name not in flavors:
            resources = {"VCPU": vcpu, "MEMORY_MB": mem, "DISK_GB": disk}
            if gpu:
                resources["CUSTOM_GPU"] = 1
            lm.flavors.create({"name": name, "resources": resources})
            flavors.add(name)
        fixed = GROUP_SCENARIOS[scenario]
        if group_left == 0 and (fixed is not None or rng.random() < 0.01):
            groups += 1
            policy, size = fixed or ("anti-affinity", int(rng.integers(3, 51)))
            group = lm.groups.create(f"{policy}-{groups}", policy).name
            group_left = size
        vm_specs.append(VmSpec(f"vm-{i}", name, group=group if group_left else None))
        if group_left:
            group_left -= 1
    uuids = [v.uuid for v in lm.vms.create_many(vm_specs)]
    progress.advance(task)
    return lm, uuids


def violations(lm: Loadmaster) -> int:
    over = sum(
        1
        for usage in lm.allocations.usages().values()
        for u in usage.values()
        if u.active + u.pending > u.capacity
    )
    policies = {g.name: g.policy for g in lm.groups.list()}
    per_host: Counter[tuple[str, str]] = Counter()
    hosts_of: dict[str, set[str]] = {}
    for vm in lm.vms.list():
        if vm.group and vm.host:
            per_host[(vm.group, vm.host)] += 1
            hosts_of.setdefault(vm.group, set()).add(vm.host)
    doubled = sum(1 for (g, _), n in per_host.items() if n > 1 and policies[g] == "anti-affinity")
    split = sum(1 for g, on in hosts_of.items() if len(on) > 1 and policies[g] == "affinity")
    return over + doubled + split + len(audit(lm.store))


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_scheduler(lm: Loadmaster, uuids: Sequence[str]) -> Figures:
    # A scheduler service loads its snapshot once at start; after that each call only
    # re-reads host generations. The load is shown apart, not hidden in the rate.
    started = time.perf_counter()
    lm.scheduler.refresh()
    load_seconds = time.perf_counter() - started
    settle_heap()  # as ``serve`` and its scheduling process do once loaded
    started = time.perf_counter()
    result = lm.scheduler.schedule([RequestSpec(vms=list(uuids))], policy="spread")
    seconds = time.perf_counter() - started
    return Figures(
        "numpy scheduler",
        len(uuids),
        len(result.placed),
        seconds,
        [p.decision_seconds for p in result.placements],
        violations(lm),
        peak_mib(),
        f"snapshot of the hosts loaded once before: {load_seconds:.2f} s",
    )


def run_naive(lm: Loadmaster, uuids: Sequence[str], total_vms: int) -> Figures:
    """One Python loop over all hosts per VM: the same filters and spread score as the
    scheduler, over plain dicts, and the same chunked claims."""
    started = time.perf_counter()
    hosts = {h.name: h for h in lm.hosts.list()}
    usage = lm.allocations.usages()
    free = {h: {c: u.capacity - u.used for c, u in per.items()} for h, per in usage.items()}
    capacity = {h: {c: u.capacity for c, u in per.items()} for h, per in usage.items()}
    vms = {v.uuid: v for v in lm.vms.list()}
    groups = {g.name: g for g in lm.groups.list()}
    members: dict[str, set[str]] = defaultdict(set)
    latencies = []
    placed = 0
    pending: list[Claim] = []
    for uuid in uuids:
        t0 = time.perf_counter()
        vm = vms[uuid]
        best, best_score = None, -1.0
        for name, host in hosts.items():
            if host.state != "up":
                continue
            if any(t not in host.traits for t in vm.required_traits):
                continue
            if (
                vm.group
                and groups[vm.group].policy == "anti-affinity"
                and name in members[vm.group]
            ):
                continue
            room = free[name]
            if any(room.get(c, 0) < amount for c, amount in vm.resources.items()):
                continue
            score = sum(
                (room[c] - amount) / capacity[name][c] for c, amount in vm.resources.items()
            ) / len(vm.resources)
            if score > best_score:
                best, best_score = name, score
        latencies.append(time.perf_counter() - t0)
        if best is None:
            continue
        for c, amount in vm.resources.items():
            free[best][c] -= amount
        if vm.group:
            members[vm.group].add(best)
        pending.append(Claim(uuid, best, expected_generation=None))
        if len(pending) == CHUNK:
            placed += sum(o.ok for o in lm.allocations.claim_many(pending, all_or_nothing=False))
            pending = []
    if pending:
        placed += sum(o.ok for o in lm.allocations.claim_many(pending, all_or_nothing=False))
    seconds = time.perf_counter() - started
    note = ""
    if len(uuids) < total_vms:
        note = f"measured on {len(uuids)} VMs, rate extrapolated to {total_vms}"
    return Figures(
        "naive loop", len(uuids), placed, seconds, latencies, violations(lm), peak_mib(), note
    )


def add_row(table: Table, hosts: int, figures: Figures, *, end_section: bool = False) -> None:
    table.add_row(
        str(hosts),
        figures.label,
        str(figures.vms),
        str(figures.placed),
        f"{figures.rate:,.0f}",
        f"{figures.percentile(50):.3f}",
        f"{figures.percentile(99):.3f}",
        f"{figures.peak_mib:,.0f}",
        str(figures.violations),
        figures.note,
        end_section=end_section,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--vms", type=int, default=10_000)
    parser.add_argument("--baseline-vms", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--groups",
        choices=list(GROUP_SCENARIOS),
        default="mixed",
        help="mixed: 20%% of the VMs in anti-affinity groups of 3-50; or every VM in hard "
        "anti-affinity groups of 1,000, or in hard affinity groups of 10 (no naive "
        "baseline for these: it knows no affinity)",
    )
    args = parser.parse_args(argv)
    table = Table(title=f"mass start of {args.vms} VMs, persisted to SQLite, groups: {args.groups}")
    for column in (
        "hosts",
        "scheduler",
        "VMs",
        "placed",
        "placements/s",
        "p50 ms",
        "p99 ms",
        "peak RSS MiB",
        "violations",
        "note",
    ):
        table.add_column(column)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Progress(console=console, transient=True) as progress,
    ):
        for hosts in args.hosts:
            url = f"sqlite:///{Path(tmp) / f'sched-{hosts}.db'}"
            lm, uuids = build(url, hosts, args.vms, args.seed, progress, args.groups)
            task = progress.add_task(f"scheduling {args.vms} VMs on {hosts} hosts", total=None)
            fast = run_scheduler(lm, uuids)
            progress.remove_task(task)
            lm.close()
            if args.groups != "mixed":
                add_row(table, hosts, fast, end_section=True)
                continue
            base_url = f"sqlite:///{Path(tmp) / f'naive-{hosts}.db'}"
            lm, uuids = build(base_url, hosts, args.vms, args.seed, progress)
            task = progress.add_task(f"naive baseline on {hosts} hosts", total=None)
            naive = run_naive(lm, uuids[: args.baseline_vms], args.vms)
            progress.remove_task(task)
            lm.close()
            for figures in (fast, naive):
                add_row(table, hosts, figures)
            table.add_row(
                str(hosts),
                "ratio",
                "",
                "",
                f"{fast.rate / naive.rate:,.0f}x",
                f"{naive.percentile(50) / max(fast.percentile(50), 1e-9):,.0f}x",
                "",
                "",
                "",
                "",
                end_section=True,
            )
            console.print(
                f"{hosts} hosts: {fast.rate:,.0f} placements/s "
                f"(p50 {fast.percentile(50):.3f} ms, {statistics.fmean(fast.latencies) * 1000:.3f} ms mean), "
                f"naive {naive.rate:,.1f}/s, {fast.violations + naive.violations} violations"
            )
    console.print(table)


if __name__ == "__main__":
    main()
