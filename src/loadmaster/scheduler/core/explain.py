"""Why hosts are ruled out for a request: per filter, per reason, and in a group's terms
when a hard group rule is what leaves no host. Pure functions of a snapshot."""

from __future__ import annotations

import numpy as np

from loadmaster.resources import summed
from loadmaster.scheduler.core.plugins import FilterResult
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.results import Explanation, FilterCount, HostScore
from loadmaster.scheduler.core.snapshot import Bools, Ints, Snapshot


def explanation(
    snap: Snapshot,
    request: VmRequest,
    results: list[FilterResult],
    ranking: tuple[HostScore, ...] = (),
) -> Explanation:
    """Each host blamed on the first filter (in filter order) that rejected it."""
    remaining = np.ones(snap.size, np.bool_)
    counts = []
    for result in results:
        verdict = result.verdict
        removed = remaining & ~verdict.keep
        if removed.any():
            counts.append(FilterCount(result.plugin, int(removed.sum()), verdict.blame(removed)))
        remaining &= verdict.keep
    candidates = int(remaining.sum())
    headline = None if candidates else _group_headline(snap, request, results)
    return Explanation(
        request.label,
        snap.size,
        candidates,
        tuple(counts),
        headline=headline,
        ranking=ranking,
        host_reasons=_one_host_reasons(snap, request, results),
    )


def _one_host_reasons(
    snap: Snapshot, request: VmRequest, results: list[FilterResult]
) -> tuple[str, ...]:
    """With one host named (``include_hosts``, ``vm start --host``): every filter that
    rejects it and why, so the refusal speaks of that host alone."""
    if request.include_hosts is None or len(request.include_hosts) != 1:
        return ()
    (name,) = request.include_hosts
    host = snap.index.get(name)
    if host is None:
        return ()
    return tuple(
        f"{result.verdict.reason_at(host)} ({result.plugin})"
        for result in results
        if not result.verdict.keep[host]
    )


def kept(snap: Snapshot, results: list[FilterResult], but: tuple[str, ...] = ()) -> Bools:
    """The hosts every filter keeps, ``but`` the ones named."""
    keep = np.ones(snap.size, np.bool_)
    for result in results:
        if result.plugin not in but:
            keep &= result.verdict.keep
    return keep


def _group_headline(snap: Snapshot, request: VmRequest, results: list[FilterResult]) -> str | None:
    """When a hard group rule is what leaves no host, say so in the group's terms: the
    per-filter counts alone blame resources (a group too big for any one host) or the
    group filter without saying how far off the group is."""
    group = request.group
    if group is None:
        return None
    if group.policy == "affinity" and request.companions:
        others = kept(snap, results, but=("resources",))
        if not others.any():
            return None
        fit = members_fitting(snap, request, others)
        best = int(np.argmax(fit))
        # What stops the best host taking one member more than it does.
        one_more = summed(request.companions[: fit[best]])
        limits = [
            name
            for name, ok in sorted(snap.fits(request.resources, one_more).items())
            if not ok[best]
        ]
        limited = f" (limited by {', '.join(limits)})" if limits else ""
        size = len(request.companions) + 1
        return (
            f"hard affinity group {group.name} needs {size} VMs on one host; "
            f"the best host {snap.names[best]} fits {fit[best]}{limited}"
        )
    rule = "anti_affinity" if group.policy == "anti-affinity" else "max_per_host"
    if rule not in (result.plugin for result in results):
        return None
    # A host the group filled is often full by resources too (its members use them):
    # the rule is the reason when every host the remaining filters keep holds its
    # share of members already.
    others = kept(snap, results, but=(rule, "resources"))
    if not others.any():
        return None
    cap = group.max_per_host or 1
    members = snap.group_members.get(group.name)
    if members is None or (members[others] < cap).any():
        return None
    needed = -(-request.group_size // cap)
    return (
        f"{group.policy} group {group.name} (at most {cap} per host) needs {needed} hosts "
        f"for its {request.group_size} VMs; 0 are left: the {int(others.sum())} hosts that "
        f"pass the other filters hold {cap} already"
    )


def members_fitting(snap: Snapshot, request: VmRequest, keep: Bools) -> Ints:
    """Per host, how many members of the request's hard-affinity group (the request
    itself first, then its companions in order) fit on it together; 0 outside ``keep``."""
    fit = np.zeros(snap.size, np.int64)
    ok = keep.copy()
    for n in range(1, len(request.companions) + 2):
        companions = summed(request.companions[: n - 1])
        for fits in snap.fits(request.resources, companions).values():
            ok &= fits
        if not ok.any():
            break
        fit[ok] = n
    return fit
