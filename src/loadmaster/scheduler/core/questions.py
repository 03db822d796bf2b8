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
from loadmaster.scheduler.core.snapshot import Ints, Snapshot

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
    counts = fitting_count(snap, request)
    counts[~keep] = 0
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


def fitting_count(snap: Snapshot, request: VmRequest) -> Ints:
    """Per host, how many copies of the request fit by resources (unit rules included)."""
    counts = np.full(snap.size, np.iinfo(np.int64).max, np.int64)
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
        counts = np.minimum(counts, per_host)
    if request.one_numa_node:
        counts = np.minimum(counts, snap.one_node_counts(request.resources))
    return counts


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
