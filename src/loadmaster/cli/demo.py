"""``loadmaster demo``: a cluster at work, in-process on the embedded SQLite default.

Builds hundreds of hosts (custom resources, traits, racks as aggregates), starts an
existing workload, then mass-starts thousands of VMs with server groups through the
scheduler; agents' reports bring most of them up (pending -> active) while some stay
pending; prints per-host usage and one "no valid host" explanation, and writes an HTML
report with charts.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from loadmaster.cli.app import app
from loadmaster.cli.client import Exit, fail
from loadmaster.cluster import VmSpec
from loadmaster.cluster.hosts import now
from loadmaster.errors import LoadmasterError
from loadmaster.pending import audit
from loadmaster.scheduler import NoHostFits, RequestSpec
from loadmaster.service import Loadmaster, open_loadmaster
from loadmaster.tiers import TIER_NAMES

console = Console(highlight=False)
BATCH = 100
ClassUsages = dict[str, dict[str, tuple[int, int, int]]]
SHOWN_CLASSES = ("VCPU", "MEMORY_MB", "CUSTOM_GPU", "CUSTOM_LICENSE_X")
CHARTED_CLASSES = ("VCPU", "MEMORY_MB")
# (name, resources, required traits, share of the VMs)
FLAVORS: tuple[tuple[str, dict[str, int], list[str], float], ...] = (
    ("small", {"VCPU": 1, "MEMORY_MB": 2048, "DISK_GB": 20}, [], 0.30),
    ("medium", {"VCPU": 2, "MEMORY_MB": 4096, "DISK_GB": 40}, [], 0.30),
    ("large", {"VCPU": 4, "MEMORY_MB": 8192, "DISK_GB": 80}, [], 0.18),
    (
        "xlarge.avx512",
        {"VCPU": 8, "MEMORY_MB": 32768, "DISK_GB": 160},
        ["HW_CPU_X86_AVX512F"],
        0.08,
    ),
    ("gpu.medium", {"VCPU": 4, "MEMORY_MB": 16384, "DISK_GB": 80, "CUSTOM_GPU": 1}, [], 0.06),
    ("licensed", {"VCPU": 2, "MEMORY_MB": 4096, "DISK_GB": 40, "CUSTOM_LICENSE_X": 1}, [], 0.08),
)


@dataclass
class MassStart:
    decision_ms: list[float]
    timeline: list[tuple[float, int, int]]
    placed: int
    failed: int
    conflicts: int
    seconds: float
    first_failure: NoHostFits | None


@app.command("demo")
def demo(
    db: Annotated[
        str, typer.Option(help="SQLite database, recreated on each run")
    ] = "sqlite:///loadmaster-demo.db",
    hosts: Annotated[int, typer.Option(min=2, help="hosts to build")] = 300,
    vms: Annotated[int, typer.Option(min=10, help="VMs to start")] = 3000,
    out: Annotated[Path, typer.Option(help="report directory")] = Path("loadmaster-report"),
    seed: int = 7,
    pending_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="share of started VMs left pending")
    ] = 0.1,
) -> None:
    """Build a cluster, mass-start VMs with server groups, bring them up, write a report."""
    if not db.startswith("sqlite:///") or db == "sqlite:///:memory:":
        fail("the demo recreates its database: give --db sqlite:///FILE", Exit.USAGE)
    started = time.perf_counter()
    database = Path(db.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        database.with_name(database.name + suffix).unlink(missing_ok=True)
    rng = random.Random(seed)
    with open_loadmaster(db) as lm:
        build_cluster(lm, hosts, rng)
        uuids = create_vms(lm, vms, rng)
        existing = uuids[: len(uuids) // 5]
        console.print(
            f"[bold]cluster[/]: {hosts} hosts, {len(lm.flavors.list())} flavors, "
            f"{len(lm.groups.list())} server groups, {len(uuids)} VMs requested"
        )
        run = mass_start(lm, existing, "existing workload", policy="pack")
        bring_up(lm, existing, set(), now())
        before = usage_by_class(lm)
        console.print(f"existing workload: {run.placed} VMs running before the mass start")

        mass_began = now()
        newcomers = uuids[len(existing) :]
        run = mass_start(lm, newcomers, "mass start", policy="spread")
        console.print(
            f"[bold]mass start[/]: {run.placed} placed, {run.failed} without a host, "
            f"{run.conflicts} claim races, {run.seconds:.1f} s "
            f"({run.placed / max(run.seconds, 1e-9):.0f} VMs/s)"
        )
        left_pending = set(rng.sample(newcomers, int(len(newcomers) * pending_share)))
        activated = bring_up(lm, newcomers, left_pending, mass_began)
        pending_now = len(lm.vms.list(state="pending"))
        console.print(
            f"[bold]bring-up[/]: hosts reported their VMs; {activated} activated, "
            f"{pending_now} still pending (not yet reported by their hosts)"
        )
        after = usage_by_class(lm)
        console.print("[bold]cluster usage[/] (pending counts as used):")
        print_cluster_usage(after)
        top = top_hosts(after, 15)
        print_top(top)
        explanation = explain_no_valid_host(lm, run.first_failure)
        problems = audit(lm.store)
        console.print(f"ledger audit: {len(problems)} problem(s)")
        # matplotlib loads here, not whenever the CLI starts.
        from loadmaster.report import ReportData, write_report

        total = time.perf_counter() - started
        report = write_report(
            ReportData(
                subtitle=(
                    f"{hosts} hosts, {len(uuids)} VMs, seed {seed}, database {db}; existing "
                    "workload placed with the pack policy, the mass start with spread"
                ),
                facts=[
                    ("hosts", str(hosts)),
                    ("VMs placed in the mass start", f"{run.placed} of {len(newcomers)}"),
                    ("VMs per second", f"{run.placed / max(run.seconds, 1e-9):.0f}"),
                    ("left pending", str(pending_now)),
                    ("claim races retried", str(run.conflicts)),
                    ("no valid host", str(run.failed)),
                    ("ledger audit problems", str(len(problems))),
                    ("seconds from empty database to report", f"{total:.1f}"),
                ],
                hosts=sorted(after["VCPU"]),
                before={c: before[c] for c in CHARTED_CLASSES},
                after={c: after[c] for c in CHARTED_CLASSES},
                decision_ms=run.decision_ms,
                timeline=run.timeline,
                top_head=TOP_HEAD,
                top_rows=top,
                explanation=explanation,
            ),
            out,
        )
    console.print(f"report: [bold]{report.resolve()}[/] ({time.perf_counter() - started:.1f} s)")


def build_cluster(lm: Loadmaster, count: int, rng: random.Random) -> None:
    """Three hardware generations in racks of 20; every tenth host has 4 GPUs, every
    fifth 8 seats of a licensed product; 2% are in maintenance."""
    lm.resource_classes.create("CUSTOM_GPU", kind="accelerator", unit="gpu")
    lm.resource_classes.create("CUSTOM_LICENSE_X", kind="license", unit="seat")
    lm.traits.create("CUSTOM_GPU_HOST")
    specs = []
    for i in range(count):
        cores, mem_gib, traits = [
            (16, 32, ["HW_CPU_X86_AVX2"]),
            (24, 48, ["HW_CPU_X86_AVX2", "STORAGE_DISK_SSD"]),
            (32, 96, ["HW_CPU_X86_AVX2", "HW_CPU_X86_AVX512F", "STORAGE_DISK_SSD"]),
        ][i % 3]
        inventories: dict[str, dict[str, object]] = {
            "VCPU": {"total": cores, "allocation_ratio": 2.0, "max_unit": cores},
            "MEMORY_MB": {"total": mem_gib * 1024, "reserved": 4096},
            "DISK_GB": {"total": rng.choice([2000, 4000])},
        }
        if i % 10 == 0:
            inventories["CUSTOM_GPU"] = {"total": 4}
            traits = [*traits, "CUSTOM_GPU_HOST"]
        if i % 5 == 1:
            inventories["CUSTOM_LICENSE_X"] = {"total": 8}
        specs.append(
            {
                "name": f"host-{i:04d}",
                "inventories": inventories,
                "traits": traits,
                "aggregates": [f"rack-{i // 20:02d}"],
                "state": "maintenance" if i % 50 == 49 else "up",
            }
        )
    lm.hosts.create_many(specs)
    for name, resources, required, _share in FLAVORS:
        lm.flavors.create({"name": name, "resources": resources, "required_traits": required})
    # Asks for more GPUs than any host has: the demo's "no valid host".
    lm.flavors.create(
        {"name": "gpu.giant", "resources": {"VCPU": 16, "MEMORY_MB": 65536, "CUSTOM_GPU": 8}}
    )


def create_vms(lm: Loadmaster, count: int, rng: random.Random) -> list[str]:
    """VMs of mixed flavors; about a quarter in hard anti-affinity groups (web tiers),
    a few in affinity groups (app + cache pairs), some in one soft-anti-affinity group."""
    names = [f[0] for f in FLAVORS]
    weights = [f[3] for f in FLAVORS]
    soft = lm.groups.create("batch-spread", "soft-anti-affinity").name
    specs: list[VmSpec] = []
    group_members: list[tuple[str, int]] = []
    i = 0
    while i < count:
        roll = rng.random()
        if roll < 0.25:
            size = rng.randint(3, 12)
            group = lm.groups.create(f"web-{len(group_members):03d}", "anti-affinity").name
            flavor = "small"
        elif roll < 0.32:
            size = rng.randint(2, 3)
            group = lm.groups.create(f"app-{len(group_members):03d}", "affinity").name
            flavor = "medium"
        elif roll < 0.40:
            size, group, flavor = 1, soft, "small"
        else:
            size, group, flavor = 1, None, rng.choices(names, weights)[0]
        size = min(size, count - i)
        group_members.append((group or "", size))
        for _ in range(size):
            specs.append(
                VmSpec(
                    f"vm-{i:05d}",
                    flavor,
                    project_id=f"project-{rng.randint(1, 8)}",
                    tags=[rng.choice(TIER_NAMES)],
                    group=group,
                )
            )
            i += 1
    return [v.uuid for v in lm.vms.create_many(specs)]


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
    )


def mass_start(lm: Loadmaster, uuids: Sequence[str], label: str, *, policy: str) -> MassStart:
    """Schedule in batches of ``BATCH`` (each VM decided, then claimed pending), so the
    progress bar moves; members of one group stay in one batch (affinity needs it)."""
    batches = _batches(lm, uuids)
    run = MassStart([], [], 0, 0, 0, 0.0, None)
    began = time.perf_counter()
    with _progress() as progress:
        task = progress.add_task(label, total=len(uuids), note="")
        for batch in batches:
            result = lm.scheduler.schedule([RequestSpec(vms=batch)], policy=policy)
            run.placed += len(result.placed)
            run.conflicts += result.conflicts
            for placement in result.placements:
                run.decision_ms.append(placement.decision_seconds * 1000)
                if not placement.ok:
                    run.failed += 1
                    if run.first_failure is None and isinstance(placement.error, NoHostFits):
                        run.first_failure = placement.error
            run.timeline.append((time.perf_counter() - began, run.placed, run.failed))
            progress.update(
                task, advance=len(batch), note=f"{run.placed} placed, {run.failed} no host"
            )
    run.seconds = time.perf_counter() - began
    return run


def _batches(lm: Loadmaster, uuids: Sequence[str]) -> list[list[str]]:
    by_group: dict[str | None, list[str]] = defaultdict(list)
    wanted = set(uuids)
    order = []
    for vm in lm.vms.list(state="requested"):
        if vm.uuid in wanted:
            if vm.group is None or vm.group not in by_group:
                order.append(vm.group if vm.group is not None else vm.uuid)
            by_group[vm.group if vm.group is not None else vm.uuid].append(vm.uuid)
    batches: list[list[str]] = [[]]
    for key in order:
        members = by_group[key]
        if batches[-1] and len(batches[-1]) + len(members) > BATCH:
            batches.append([])
        batches[-1].extend(members)
    return [b for b in batches if b]


def bring_up(lm: Loadmaster, uuids: Sequence[str], held_back: set[str], as_of: datetime) -> int:
    """What the hosts' agents do: each reports the VMs it runs; the ledger activates the
    pending ones it sees. VMs in ``held_back`` have not booted yet, and their claims are
    newer than ``as_of``, so the report leaves them pending."""
    wanted = set(uuids)
    running: dict[str, list[str]] = defaultdict(list)
    for vm in lm.vms.list():
        if vm.host is not None and (
            vm.state == "running" or (vm.uuid in wanted and vm.uuid not in held_back)
        ):
            running[vm.host].append(vm.uuid)
    activated = 0
    with _progress() as progress:
        task = progress.add_task("host reports", total=len(running), note="")
        for host, present in sorted(running.items()):
            result = lm.allocations.reconcile(host, present, as_of=as_of)
            activated += len(result.activated)
            progress.update(task, advance=1, note=f"{activated} VMs up")
    return activated


def usage_by_class(lm: Loadmaster) -> ClassUsages:
    """class -> host -> (capacity, active, pending)."""
    result: ClassUsages = defaultdict(dict)
    for host, classes in lm.allocations.usages().items():
        for name, u in classes.items():
            result[name][host] = (u.capacity, u.active, u.pending)
    return result


TOP_HEAD = (
    "host",
    "VCPU act",
    "pend",
    "cap",
    "GiB act",
    "pend",
    "cap",
    "GPU",
    "LIC_X",
    "used",
)


def _share(after: ClassUsages, host: str) -> float:
    """A host's fill: the larger of its VCPU and memory use, pending included."""
    return max(sum(after[c][host][1:]) / max(after[c][host][0], 1) for c in CHARTED_CLASSES)


def top_hosts(after: ClassUsages, count: int) -> list[list[object]]:
    rows: list[list[object]] = []
    for host in sorted(after["VCPU"], key=lambda h: -_share(after, h))[:count]:
        capacity, active, pending = after["VCPU"][host]
        row: list[object] = [host, active, pending, capacity]
        capacity, active, pending = after["MEMORY_MB"][host]
        row += [round(active / 1024), round(pending / 1024), round(capacity / 1024)]
        for name in ("CUSTOM_GPU", "CUSTOM_LICENSE_X"):
            usage = after.get(name, {}).get(host)
            row.append(f"{usage[1] + usage[2]}/{usage[0]}" if usage else "-")
        row.append(f"{_share(after, host) * 100:.0f}%")
        rows.append(row)
    return rows


def print_top(rows: list[list[object]]) -> None:
    table = Table(
        title="Fullest hosts: active and pending (pending counts as used)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for i, head in enumerate(TOP_HEAD):
        table.add_column(head, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(str(c) for c in row))
    console.print(table)


def print_cluster_usage(after: ClassUsages) -> None:
    for name in SHOWN_CLASSES:
        per_host = after.get(name, {}).values()
        capacity = sum(u[0] for u in per_host) or 1
        active, pending = sum(u[1] for u in per_host), sum(u[2] for u in per_host)
        console.print(
            f"  {name:<17} {100 * (active + pending) / capacity:5.1f}% used: "
            f"{100 * active / capacity:5.1f}% active, {100 * pending / capacity:4.1f}% pending"
        )


def explain_no_valid_host(lm: Loadmaster, failure: NoHostFits | None) -> str:
    """Start a VM no host can take (8 GPUs; hosts have 4) and show why, filter by
    filter; a failure from the mass start itself is shown too, if there was one."""
    vm = lm.vms.create("gpu-giant", "gpu.giant")
    result = lm.scheduler.schedule([RequestSpec(vms=[vm.uuid])])
    error = result.placements[0].error
    lines = []
    for title, item in (("gpu-giant (8 GPUs)", error), ("first mass-start failure", failure)):
        if not isinstance(item, NoHostFits):
            continue
        e = item.explanation
        lines.append(f"{title}: {e.message}")
        lines += [
            f"  {f.filter:<14} removed {f.removed:>4}: "
            + ", ".join(f"{n} {r}" for r, n in f.reasons.items())
            for f in e.filters
        ]
    text = "\n".join(lines)
    console.print("[bold]no valid host[/] " + text)
    if isinstance(error, LoadmasterError) and not isinstance(error, NoHostFits):
        console.print(f"unexpected: {error.detail}")
    return text
