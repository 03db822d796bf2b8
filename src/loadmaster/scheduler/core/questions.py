"""Read-only questions about one request, answered from a snapshot with no I/O: why hosts
are ruled out (with the best hosts' scores per weigher), and how many more VMs fit where."""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.core.decide import (
    FilterResult,
    LoadedPolicy,
    filter_hosts,
    score_rows,
    weigh,
)
from loadmaster.scheduler.core.explain import explanation
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.results import CapacityReport, Explanation
from loadmaster.scheduler.core.snapshot import Bools, Ints, Snapshot

RANKED = 5  # hosts listed with their scores


def explain(snap: Snapshot, request: VmRequest, policy: LoadedPolicy) -> Explanation:
    """Every filter's count of hosts ruled out and why, and the best hosts left, scored."""
    results, keep = filter_hosts(snap, request, policy)
    candidates = np.flatnonzero(keep)
    weighed = weigh(snap, request, candidates, policy.weighers)
    total = sum((w for _, w in weighed), np.zeros(len(candidates)))
    best = [int(i) for i in np.argsort(-total, kind="stable")[:RANKED]]
    return explanation(snap, request, results, score_rows(snap, candidates, weighed, best))


def capacity(
    snap: Snapshot, request: VmRequest, policy: LoadedPolicy, flavor: str, group: str | None
) -> CapacityReport:
    """How many more VMs of the request fit now, and on which hosts (most first, then
    the policy's best). With a hard-affinity group all of them must share one host, so
    ``total`` is the most any single host takes."""
    results, keep = filter_hosts(snap, request, policy.unweighed())
    counts = fitting_count(snap, request, keep)
    if request.group is not None:
        members = snap.group_members[request.group.name]
        cap = request.group.max_per_host or (1 if request.group.policy == "anti-affinity" else None)
        if cap is not None:
            counts = np.minimum(counts, np.maximum(cap - members, 0))
    hard_affinity = request.group is not None and request.group.policy == "affinity"
    total = int(counts.max(initial=0) if hard_affinity else counts.sum())
    candidates = np.flatnonzero(counts)
    weighed = weigh(snap, request, candidates, policy.weighers)
    scores = sum((w for _, w in weighed), np.zeros(len(candidates)))
    # Most VMs first; among hosts taking as many, the policy's best first.
    order = np.lexsort((-scores, -counts[candidates]))
    per_host = {snap.names[h]: int(counts[h]) for h in candidates[order]}
    limits = {
        snap.names[h]: _zero_reason(snap, request, results, int(h))
        for h in np.flatnonzero(counts == 0)
    }
    return CapacityReport(flavor, total, per_host, group, dict(sorted(limits.items())))


def fitting_count(snap: Snapshot, request: VmRequest, keep: Bools) -> Ints:
    """Per host ``keep`` marks, how many copies of the request fit by resources (unit
    rules included); 0 on the others."""
    unlimited = np.iinfo(np.int64).max
    counts = np.full(snap.size, unlimited, np.int64)
    pooled: list[tuple[Bools, Ints]] = []
    for name, amount in request.resources.items():
        column = snap.classes.get(name)
        if column is None:
            return np.zeros(snap.size, np.int64)
        free = np.maximum(snap.capacity[column] - snap.used[column], 0)
        per_provider = np.where(snap.unit_ok(column, amount), free // amount, 0)
        per_host = (
            per_provider
            if snap.flat
            else np.bincount(snap.root_of, weights=per_provider, minlength=snap.size).astype(
                np.int64
            )
        )
        if snap.sharing:
            # Hosts offering the class only through a pool: counted below, the pool's
            # count shared out among them.
            drawing = (snap.host_capacity[column] == 0) & snap.reach.any(axis=1)
            per_host = np.where(drawing, unlimited, per_host)
            pooled.append((drawing, per_provider[snap.sharing_rows]))
        counts = np.minimum(counts, per_host)
    if request.one_numa_node:
        counts = np.minimum(counts, snap.one_node_counts(request.resources))
    counts[~keep] = 0
    for drawing, per_pool in pooled:
        counts = _shared_out(snap, counts, drawing, per_pool.copy())
    return counts


def _shared_out(snap: Snapshot, counts: Ints, drawing: Bools, left: Ints) -> Ints:
    """``counts`` with each host that ``drawing`` marks taking what its other classes
    allow from the pools it reaches, in host order, so the hosts of one pool together
    never count it twice."""
    out = counts.copy()
    for h in np.flatnonzero(drawing).tolist():
        took = 0
        for k in np.flatnonzero(snap.reach[h]).tolist():
            take = min(int(counts[h]) - took, int(left[k]))
            took += take
            left[k] -= take
        out[h] = took
    return out


def _zero_reason(snap: Snapshot, request: VmRequest, results: list[FilterResult], host: int) -> str:
    """Why not one more VM of the request fits on ``host``: the first filter that
    rejects it (a class short by how much, rather than only "short of"), else the
    group's cap on the host."""
    for result in results:
        if not result.verdict.keep[host]:
            reason = result.verdict.reason_at(host)
            if result.plugin == "resources":
                return _shortfall(snap, request, host) or reason
            return reason
    group = request.group
    if group is not None:
        return f"group {group.name} is at its limit on this host"
    return _shortfall(snap, request, host) or "no room for one more"


def _shortfall(snap: Snapshot, request: VmRequest, host: int) -> str | None:
    short = []
    for name, amount in sorted(request.resources.items()):
        column = snap.classes.get(name)
        pools = (
            []
            if column is None
            else [r for r in snap.sharing.get(host, []) if snap.capacity[column, r] > 0]
        )
        if column is not None and pools and not snap.host_capacity[column, host]:
            free = max(int(snap.capacity[column, r] - snap.used[column, r]) for r in pools)
            if free < amount:
                where = ", ".join(snap.provider_names[r] for r in pools)
                short.append(f"{name} short by {amount - free} in pool {where}")
            continue
        if column is None or not snap.host_capacity[column, host]:
            short.append(f"no {name} inventory")
            continue
        free = int(snap.host_capacity[column, host] - snap.host_used[column, host])
        if free < amount:
            short.append(f"{name} short by {amount - free} (free {max(free, 0)} of {amount})")
            continue
        rows = snap.tree[host]
        if not (snap.capacity[column, rows] - snap.used[column, rows] >= amount).any():
            short.append(f"{name}: no one provider of the host has {amount} free")
        elif not snap.unit_ok(column, amount)[rows].any():
            short.append(f"{name} unit rules (min, max, step) refuse {amount}")
    return "; ".join(short) or None
