"""Drain throughput: a rolling maintenance of every host, with simulated host agents.

Usage: .venv/bin/python bench/drain.py [--hosts 20] [--vms 200] [--agents 4] [--db URL]
(default: a fresh SQLite file in a temporary directory).

The VMs start spread over the hosts, about a third of them in hard groups (anti-affinity
triples, affinity pairs, max_per_host=2 groups). Then each host in turn is drained; the
simulated agents (``--agents`` threads) complete every migration with ``activate`` (each
VM that was only pending starts on its new host), and the host comes back up before the
next one is drained. After every drain and every round the committed state is checked
for broken group rules. Prints VMs moved per second for the drain calls alone and for
drain plus agents, and the number of violations (must be 0), measured in this run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.pending import group_rule_problems
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster


def violations(lm: Loadmaster) -> int:
    """Broken hard group rules in the committed state (a migrating VM counts on both)."""
    return len(group_rule_problems(lm.store))


def build(lm: Loadmaster, hosts: int, vms: int) -> None:
    lm.hosts.create_many(
        [
            {
                "name": f"h{i:02d}",
                "inventories": {"VCPU": {"total": 64}, "MEMORY_MB": {"total": 262144}},
            }
            for i in range(hosts)
        ]
    )
    lm.flavors.create({"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 4096}})
    specs: list[VmSpec] = []
    grouped = vms // 3
    while len(specs) < grouped:
        n = len(specs)
        kind = (n // 7) % 3
        if kind == 0:
            group = lm.groups.create(f"apart{n}", "anti-affinity").name
            size = 3
        elif kind == 1:
            group = lm.groups.create(f"together{n}", "affinity").name
            size = 2
        else:
            group = lm.groups.create(f"capped{n}", "anti-affinity", max_per_host=2).name
            size = 4
        specs += [VmSpec(f"{group}-{i}", "small", group=group) for i in range(size)]
    specs += [VmSpec(f"plain{i}", "small") for i in range(vms - len(specs))]
    created = [v.uuid for v in lm.vms.create_many(specs[:vms])]
    result = lm.scheduler.schedule([RequestSpec(vms=created)])
    assert result.ok, [p.error for p in result.failed][:3]
    for vm in created:
        lm.allocations.activate(vm)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--vms", type=int, default=200)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--db", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'drain.db'}"
        lm = loadmaster.open(url)
        build(lm, args.hosts, args.vms)
        broken = violations(lm)
        moved = unplaced = 0
        drain_seconds = total_seconds = 0.0
        with ThreadPoolExecutor(args.agents) as agents:
            for host in sorted(h.name for h in lm.hosts.list(roots_only=True)):
                started = time.perf_counter()
                result = lm.maintenance.drain(host)
                drained = time.perf_counter()
                broken += violations(lm)
                # The agents: migrations complete, re-placed pending VMs start.
                list(agents.map(lm.allocations.activate, result.moved))
                finished = time.perf_counter()
                broken += violations(lm)
                assert not lm.maintenance.status(host).vms_left, host
                moved += len(result.moved)
                unplaced += len(result.unplaced)
                drain_seconds += drained - started
                total_seconds += finished - started
                lm.hosts.set_state(host, "up")  # maintenance over
        lm.close()
    backend = url.split(":", 1)[0]
    print(
        f"drain, {args.hosts} hosts each drained in turn, {args.vms} VMs ({backend}, "
        f"{args.agents} agent threads): {moved} VMs moved, {unplaced} unplaced; "
        f"drain calls {moved / drain_seconds:.0f} VMs/s ({drain_seconds:.2f} s), "
        f"with agents completing {moved / total_seconds:.0f} VMs/s ({total_seconds:.2f} s); "
        f"group-rule violations {broken}"
    )


if __name__ == "__main__":
    main()
