"""The scheduling core: ``decide(snapshot, requests, policy, seed)``, a function with no I/O.

It filters, weighs and picks a host for each request in turn, on a working copy of the
snapshot's usage that takes each decision before the next one is made (pending counts as
used, for resources and for server groups alike), and returns one ``Decision`` per request.
The snapshot is never changed, nothing is kept between calls, and the same snapshot,
requests, policy and seed give the same decisions: a decision can be replayed from its seed.
Within a call, the verdicts and raw scores of host-local plugins (``plugins.py``) are kept
per request shape and brought up to date on the hosts the decisions changed, so a mass
start does not ask every plugin about every host for every VM.
Resolving requests from the store and claiming the decisions live around it
(``resolve.py``, ``scheduler.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar, cast, overload

import numpy as np

from loadmaster.errors import LoadmasterError, PluginFailed
from loadmaster.scheduler.core.explain import explanation
from loadmaster.scheduler.core.plugins import (
    FilterResult,
    LoadedFilter,
    Verdict,
    Weigher,
    host_view,
    local_weigher,
)
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.results import HostScore, NoHostFits
from loadmaster.scheduler.core.snapshot import Bools, Floats, Ints, Snapshot

log = logging.getLogger("loadmaster.scheduler")
T = TypeVar("T")
# A kept verdict is worked out again over every host after this many changes (or an
# eighth of the hosts, if more) since it was last used.
FULL_AFTER = 64
# A spreading batch of at least ROUNDS_FROM requests is decided ROUND requests at a time
# (``_decide_round``), at most one per ROUND_SHARE hosts: one numpy pass per shape instead
# of one per VM. Smaller calls, and every call with ``rounds=False``, decide one request
# at a time.
ROUNDS_FROM = 64
ROUND = 256
ROUND_SHARE = 32


@dataclass(frozen=True)
class LoadedPolicy:
    """A policy made ready to use (kube-scheduler's profile, once its plugins are built):
    its filters (in order) and weighers with multipliers, how many feasible hosts to score
    (``sample``, None: all), and how a winner is drawn: among the hosts within
    ``tie_tolerance`` (a fraction of the summed multipliers) of the best, one of the
    ``subset_size`` best at random, so schedulers running side by side spread out instead
    of all claiming the same host."""

    name: str
    filters: tuple[LoadedFilter, ...]
    weighers: tuple[tuple[Weigher, float], ...] = ()
    sample: int | None = None
    subset_size: int = 100
    tie_tolerance: float = 0.01

    def unweighed(self) -> LoadedPolicy:
        return replace(self, weighers=())


@dataclass
class Decision:
    """One request's outcome: ``host`` (an index into the snapshot), or ``error`` saying
    why none (``NoHostFits`` with its explanation, ``PluginFailed`` naming the plugin).
    ``results``: every filter's verdict, when the request fits nowhere or with
    ``breakdown`` (a placed VM's are not kept: a mass start would work them out over every
    host for every VM). ``scores``: with ``breakdown``, the chosen host's score per
    weigher, then the runners-up's."""

    index: int
    request: VmRequest
    host: int | None
    results: list[FilterResult]
    error: LoadmasterError | None = None
    seconds: float = 0.0
    scores: tuple[HostScore, ...] = ()


@dataclass
class _Call:
    """What one ``decide`` call carries from request to request."""

    policy: LoadedPolicy
    rng: np.random.Generator
    breakdown: bool
    snap: Snapshot
    owned: bool = False  # snap is our working copy (True) or the caller's snapshot
    statics: dict[tuple[Hashable, ...], tuple[Bools, list[FilterResult]]] = field(
        default_factory=dict
    )
    # The host-local plugins' verdicts and raw scores, kept up to date (None: every
    # plugin is asked over every host for every request, as ``incremental=False`` does).
    local: _Local | None = None


class _KeptVerdict:
    """A host-local filter's hosts kept, for one value of the request fields it reads,
    up to date as of change ``seen``; ``reasons``: its checks' (None: it said None)."""

    __slots__ = ("keep", "reasons", "seen")

    def __init__(self, seen: int, verdict: Verdict | None) -> None:
        self.seen = seen
        self.reasons = None if verdict is None else tuple(r for _, r in verdict.checks)
        self.keep = None if verdict is None else np.array(verdict.keep, np.bool_)


class _KeptScores:
    """A host-local weigher's raw scores over every host, for one value of the request
    fields it reads (None: no opinion), up to date as of change ``seen``."""

    __slots__ = ("raw", "seen")

    def __init__(self, seen: int, raw: Floats | None) -> None:
        self.seen = seen
        self.raw = None if raw is None else np.array(raw)


_MISSING = object()


class _Values:
    """The request fields plugins read, made hashable once per request."""

    def __init__(self) -> None:
        self.request: VmRequest | None = None
        self.memo: dict[str, Hashable] = {}

    def of(self, request: VmRequest, fields: Sequence[str]) -> tuple[Hashable, ...]:
        if request is not self.request:
            self.request, self.memo = request, {}
        out = []
        for name in fields:
            value = self.memo.get(name, _MISSING)
            if value is _MISSING:
                value = self.memo[name] = _hashable(getattr(request, name))
            out.append(value)
        return tuple(out)


class _Local:
    """The host-local plugins of a policy and their answers, kept per value of the request
    fields each reads, and which hosts the decisions so far changed. A filter's kept
    verdict is brought up to date by asking it about the hosts changed since it was last
    used (``changes``), or about every host once many have; a weigher's kept scores the
    same way."""

    def __init__(self, policy: LoadedPolicy, requests: int, size: int) -> None:
        self.filters = {
            id(e): tuple(sorted(e.reads or ())) for e in policy.filters if e.local is not None
        }
        self.weighers: dict[int, tuple[str, tuple[str, ...]]] = {}
        for position, (weigher, _) in enumerate(policy.weighers):
            reads = local_weigher(weigher)
            if reads is not None:
                name = str(getattr(weigher, "name", type(weigher).__name__))
                self.weighers[position] = (name, tuple(sorted(reads)))
        statics = [e for e in policy.filters if e.mask is not None and not e.dynamic]
        # The fields the static filters read, when all declare them (None: not cached).
        self.static_fields = (
            tuple(sorted({f for e in statics for f in e.reads or ()}))
            if all(e.reads is not None for e in statics)
            else None
        )
        self.statics: dict[tuple[Hashable, ...], Bools] = {}
        self.verdicts: dict[tuple[Hashable, ...], _KeptVerdict] = {}
        self.scores: dict[tuple[Hashable, ...], _KeptScores] = {}
        self.values = _Values()
        self.changes = np.zeros(requests, np.int64)  # the host each decision changed
        self.count = 0
        self.size = size
        # Past this many changes since a kept verdict was last used, ask about every host.
        self.full_after = max(size // 8, FULL_AFTER)

    def changed(self, host: int) -> None:
        self.changes[self.count] = host
        self.count += 1

    def changed_everywhere(self) -> None:
        """A claim on a sharing provider (a pool several hosts draw from) changes every
        host that reaches it: no kept answer holds."""
        self.verdicts.clear()
        self.scores.clear()

    def verdict(self, snap: Snapshot, entry: LoadedFilter, request: VmRequest) -> Bools | None:
        """The hosts the filter keeps, as of now (None: it said None)."""
        key = (id(entry), *self.values.of(request, self.filters[id(entry)]))
        kept = self.verdicts.get(key)
        if kept is not None:
            if kept.reasons is None or kept.seen == self.count:
                # (Whether a host-local filter concerns a request depends on the request.)
                return kept.keep
            if self.count - kept.seen <= self.full_after:
                at = self.changes[kept.seen : self.count]
                assert entry.local is not None and kept.keep is not None
                seen = cast(VmRequest, _Fields(request, entry.name, entry.reads))
                part = _plugin("filter", entry.name, entry.local.mask_at, snap, seen, at)
                if part is not None and tuple(r for _, r in part.checks) == kept.reasons:
                    kept.keep[at] = part.keep
                    kept.seen = self.count
                    return kept.keep
                # Other checks than before: ask about every host.
        assert entry.local is not None
        seen = cast(VmRequest, _Fields(request, entry.name, entry.reads))
        verdict = _plugin("filter", entry.name, entry.local.mask, snap, seen)
        kept = self.verdicts[key] = _KeptVerdict(self.count, verdict)
        return kept.keep

    def raw(
        self, snap: Snapshot, position: int, weigher: Weigher, request: VmRequest, at: Ints | None
    ) -> tuple[bool, Floats | None]:
        """The weigher's raw scores for the candidates ``at`` (None: every host, the kept
        array itself, not to be changed), as of now: (False, None) if it is not
        host-local, (True, None) if it has no opinion."""
        if position not in self.weighers or (at is not None and len(at) * 4 < self.size):
            # A few candidates (a sample): scoring them afresh costs less than reading
            # their kept scores, scattered over arrays of every host.
            return False, None
        name, fields = self.weighers[position]
        key = (position, *self.values.of(request, fields))
        kept = self.scores.get(key)
        if kept is not None and kept.raw is None:
            return True, None  # (so does whether a host-local weigher has an opinion)
        seen = cast(VmRequest, _Fields(request, name, frozenset(fields)))
        if kept is not None and kept.seen < self.count:
            if self.count - kept.seen <= self.full_after:
                changed = self.changes[kept.seen : self.count]
                part = _plugin("weigher", name, weigher.weigh, snap, seen, changed)
                if part is not None and kept.raw is not None:
                    kept.raw[changed] = part
                    kept.seen = self.count
                else:  # (not as host-local as it says: ask it as any other)
                    del self.scores[key]
                    return False, None
            else:
                kept = None
        if kept is None:
            everywhere = np.arange(self.size)
            raw = _plugin("weigher", name, weigher.weigh, snap, seen, everywhere)
            kept = self.scores[key] = _KeptScores(self.count, raw)
            if kept.raw is None:
                return True, None
        assert kept.raw is not None
        return True, kept.raw if at is None else kept.raw[at]


def decide(
    snapshot: Snapshot,
    requests: Sequence[VmRequest],
    policy: LoadedPolicy,
    seed: int,
    *,
    all_or_nothing: bool = False,
    breakdown: bool = False,
    attempt: int = 0,
    incremental: bool = True,
    rounds: bool = True,
) -> list[Decision]:
    """One decision per request, in the order they were decided: members of a hard-
    affinity group move up to their first member, which carries the others' resources as
    companions, so the group lands together. ``all_or_nothing``: stop at the first request
    that fits nowhere (a gang fails as one). ``attempt`` > 0 draws from another stream
    of the same seed, for deciding again after a lost claim race.

    Host-local plugins (``plugins.py``) are asked over every host once per value of the
    request fields they read, then only about the hosts the decisions since changed;
    ``incremental=False`` asks every plugin about every host for every request instead
    (the same decisions, slower: the reference the tests hold the fast way to).

    A spreading batch (a policy with ``sample``) of ``ROUNDS_FROM`` requests or more is
    decided in rounds of ``ROUND`` (``_decide_round``), unless ``rounds=False``: every
    host taken is feasible with every decision before it counted, as one at a time, but
    which sampled host wins may differ, so the same seed replays the same decisions only
    with the same ``rounds``."""
    rng = np.random.default_rng(seed if not attempt else [seed, attempt])
    call = _Call(policy, rng, breakdown, snapshot)
    if incremental and (
        any(e.local is not None for e in policy.filters)
        or any(local_weigher(w) is not None for w, _ in policy.weighers)
    ):
        call.local = _Local(policy, len(requests), snapshot.size)
    ordered = order_for_groups(list(enumerate(requests)))
    # Two requests of one round seldom want the same host (one that does is decided
    # alone) when a round has at most one request per ROUND_SHARE hosts.
    round_size = min(ROUND, snapshot.size // ROUND_SHARE)
    in_rounds = (
        call.local is not None
        and rounds
        and policy.sample is not None
        and len(ordered) >= ROUNDS_FROM
        and round_size >= 2
    )
    unplaceable: dict[str, NoHostFits] = {}
    decisions: list[Decision] = []
    position = 0
    while position < len(ordered):
        index, request = ordered[position]
        if in_rounds and _in_round(request):
            run = [ordered[position]]
            while (
                len(run) < round_size
                and position + len(run) < len(ordered)
                and _in_round(ordered[position + len(run)][1])
            ):
                run.append(ordered[position + len(run)])
            position += len(run)
            decided = _decide_round(call, run, stop_on_error=all_or_nothing)
            decisions += decided
            if all_or_nothing and decided[-1].error is not None:
                break
            continue
        position += 1
        group = request.group
        if group is not None and group.name in unplaceable:
            # The group's first member, carrying the rest, fits nowhere: the group fails
            # as a whole rather than landing in pieces.
            first = unplaceable[group.name].explanation
            error = NoHostFits(replace(first, vm=request.label))
            decisions.append(Decision(index, request, None, [], error))
            continue
        started = time.perf_counter()
        decision = _decide_one(call, index, request, last=position == len(ordered))
        decision.seconds = time.perf_counter() - started
        decisions.append(decision)
        if isinstance(decision.error, NoHostFits) and group is not None and request.companions:
            unplaceable[group.name] = decision.error
        if decision.error is not None and all_or_nothing:
            break
    return decisions


def _in_round(request: VmRequest) -> bool:
    """Whether a request may be decided in a round: not a hard-affinity member (the
    affinity filter reads the whole group, and its members follow their first one)."""
    return not request.companions and (request.group is None or request.group.policy != "affinity")


def _decide_round(
    call: _Call, run: list[tuple[int, VmRequest]], *, stop_on_error: bool
) -> list[Decision]:
    """Up to ``ROUND`` requests of a large spreading batch decided by one numpy pass per
    request shape: every filter once for the shape, each request's random sample drawn
    and weighed in one matrix. A request whose chosen host an earlier one of the round
    changed, or that a filter neither static nor host-local concerns, or whose shape has
    no more feasible hosts than the sample (a small or nearly full cluster), is decided
    alone at its turn, on the state the round's earlier decisions left. So every host
    taken was feasible, with every decision before it counted, as ``_decide_one``'s are;
    what differs from deciding one at a time is only which sampled host won: a runner-up
    changed earlier in the round is ranked as it was at the round's start."""
    local, policy = call.local, call.policy
    assert local is not None and policy.sample is not None
    started = time.perf_counter()
    shapes: dict[tuple[Hashable, ...], list[int]] = {}
    for row, (_, request) in enumerate(run):
        shapes.setdefault(local.values.of(request, _SHAPE_FIELDS), []).append(row)
    picks: dict[int, tuple[Ints, int, list[tuple[str, Floats]]]] = {}
    for rows in shapes.values():
        request = run[rows[0]][1]
        keep = _kept_hosts(call, local, request, only_local=True)
        if keep is None:
            continue
        candidates = np.flatnonzero(keep)
        if len(candidates) <= policy.sample:
            continue
        sample = candidates[call.rng.integers(0, len(candidates), (len(rows), policy.sample))]
        chosen, weighed = _pick_rows(call, [run[row][1] for row in rows], sample)
        for at, (row, column) in enumerate(zip(rows, chosen.tolist(), strict=True)):
            picks[row] = (
                sample[at],
                column,
                [(name, scores[at]) for name, scores, opinion in weighed if opinion[at]],
            )
    each = (time.perf_counter() - started) / len(run)
    decisions = []
    changed: set[int] = set()
    for row, (index, request) in enumerate(run):
        picked = picks.get(row)
        host = None if picked is None else int(picked[0][picked[1]])
        if picked is None or host in changed:
            began = time.perf_counter()
            decision = _decide_one(call, index, request, last=False)
            decision.seconds = time.perf_counter() - began
        else:
            assert host is not None
            decision = Decision(index, request, host, [], seconds=each)
            if call.breakdown:
                decision.results, _ = filter_hosts(call.snap, request, policy, call.statics)
                decision.scores = _breakdown(call.snap, *picked)
            _take(call, request, host)
        decisions.append(decision)
        if decision.host is not None:
            changed.add(decision.host)
        elif stop_on_error:
            break
    return decisions


# Everything of a request a plugin may read but which VM it is: its shape.
_SHAPE_FIELDS = tuple(
    f.name for f in fields(VmRequest) if f.name not in ("vm", "label", "companions")
)


def _pick_rows(
    call: _Call, requests: list[VmRequest], sample: Ints
) -> tuple[Ints, list[tuple[str, Floats, Bools]]]:
    """One column per row of ``sample`` (one row of sampled candidates per request, all
    of one shape), chosen as ``_pick`` chooses: the weighers' raw scores rescaled to
    [0, 1] over each row, then at random among the row's ``subset_size`` best within
    ``tie_tolerance`` of its best; and each weigher's rescaled scores, with the rows it
    has an opinion on."""
    policy, snap, local = call.policy, call.snap, call.local
    assert local is not None
    count, size = sample.shape
    total = np.zeros((count, size))
    weighed: list[tuple[str, Floats, Bools]] = []
    for position, (weigher, multiplier) in enumerate(policy.weighers):
        name = str(getattr(weigher, "name", type(weigher).__name__))
        kept, raw = local.raw(snap, position, weigher, requests[0], None)
        if kept:
            if raw is None:
                continue
            scores = raw[sample]
        else:
            parts = [
                _plugin("weigher", name, weigher.weigh, snap, request, sample[row])
                for row, request in enumerate(requests)
            ]
            if all(part is None for part in parts):
                continue
            scores = np.array([np.zeros(size) if p is None else p for p in parts])
        low = scores.min(axis=1, keepdims=True)
        spread = scores.max(axis=1, keepdims=True) - low
        opinion = spread[:, 0] > 0
        part = np.zeros((count, size))
        part[opinion] = multiplier * (scores[opinion] - low[opinion]) / spread[opinion]
        total += part
        weighed.append((name, part, opinion))
    tolerance = policy.tie_tolerance * sum(abs(m) for _, m in policy.weighers)
    near = total >= total.max(axis=1, keepdims=True) - tolerance
    if size > policy.subset_size:
        # Only the subset_size best of each row may win (as ``_pick``'s argpartition).
        best = np.argpartition(-total, policy.subset_size - 1, axis=1)[:, : policy.subset_size]
        among = np.zeros_like(near)
        np.put_along_axis(among, best, True, axis=1)
        near &= among
    # Uniformly at random among each row's remaining hosts: the largest of random keys.
    keys = np.where(near, call.rng.random((count, size)), -1.0)
    return keys.argmax(axis=1), weighed


def _breakdown(
    snap: Snapshot, candidates: Ints, chosen: int, weighed: list[tuple[str, Floats]]
) -> tuple[HostScore, ...]:
    """The chosen candidate's scores per weigher, then the runners-up's (as ``_pick``)."""
    total = sum((w for _, w in weighed), np.zeros(len(candidates)))
    others = [int(i) for i in np.argsort(-total, kind="stable")[:5] if i != chosen][:4]
    return score_rows(snap, candidates, weighed, [chosen, *others])


def order_for_groups(items: list[tuple[int, VmRequest]]) -> list[tuple[int, VmRequest]]:
    """Members of a hard-affinity group move up to their first member, and that member
    carries the others' resources as ``companions`` (on a copy of its request)."""
    order: list[tuple[int, VmRequest]] = []
    bunches: dict[str, list[tuple[int, VmRequest]]] = {}
    for item in items:
        group = item[1].group
        if group is not None and group.policy == "affinity":
            if group.name not in bunches:
                bunches[group.name] = []
                order.append(item)
            bunches[group.name].append(item)
        else:
            order.append(item)
    out: list[tuple[int, VmRequest]] = []
    for index, request in order:
        group = request.group
        bunch = bunches.get(group.name, []) if group is not None else []
        if bunch and bunch[0][0] == index:
            companions = tuple(other.resources for _, other in bunch[1:])
            out.append((index, replace(request, companions=companions)))
            out.extend(bunch[1:])
        else:
            out.append((index, request))
    return out


def _decide_one(call: _Call, index: int, request: VmRequest, *, last: bool) -> Decision:
    try:
        results: list[FilterResult] | None = None
        if call.local is None:
            results, keep = filter_hosts(call.snap, request, call.policy, call.statics)
        else:
            keep = _kept_hosts(call, call.local, request)
        host, scores = _pick(call, request, keep.nonzero()[0])
        if results is None and (host is None or call.breakdown):
            # Explaining needs every filter's verdict over every host: worked out only now.
            results, _ = filter_hosts(call.snap, request, call.policy, call.statics)
    except PluginFailed as exc:
        return Decision(index, request, None, [], exc)
    results = results or []
    if host is None:
        return Decision(
            index, request, None, results, NoHostFits(explanation(call.snap, request, results))
        )
    if not last:
        _take(call, request, host)
    # (A placed VM's results are kept only with breakdown, whichever way they were found.)
    return Decision(index, request, host, results if call.breakdown else [], scores=scores)


def _take(call: _Call, request: VmRequest, host: int) -> None:
    """The next request must see this one; the caller's snapshot stays as it was."""
    if not call.owned:
        # (The static verdicts cached so far ignore usage: they hold for the copy.)
        call.snap, call.owned = call.snap.working(), True
    group = request.group
    call.snap.apply(
        host,
        request.resources,
        group.name if group is not None else None,
        one_node=request.one_numa_node,
        affinity=request.pci_numa_affinity,
        class_traits=request.class_traits,
        held=request.shared_held,
    )
    if call.local is not None:
        call.local.changed(host)
        if call.snap.sharing.get(host):
            call.local.changed_everywhere()


@overload
def _kept_hosts(call: _Call, local: _Local, request: VmRequest) -> Bools: ...
@overload
def _kept_hosts(
    call: _Call, local: _Local, request: VmRequest, *, only_local: bool
) -> Bools | None: ...
def _kept_hosts(
    call: _Call, local: _Local, request: VmRequest, *, only_local: bool = False
) -> Bools | None:
    """The hosts every filter keeps, as ``filter_hosts`` finds them, with the host-local
    filters' verdicts brought up to date rather than worked out again. ``only_local``:
    None if a dynamic filter that is not host-local concerns the request (its verdict
    could change with any decision, so the request is decided alone)."""
    snap, policy = call.snap, call.policy
    if local.static_fields is None:
        keep, _ = _static_part(snap, request, policy, call.statics, local.values)
    else:
        key = local.values.of(request, local.static_fields)
        if key not in local.statics:
            local.statics[key], _ = _static_part(snap, request, policy, call.statics, local.values)
        keep = local.statics[key]
    keep = keep.copy()
    for entry in policy.filters:
        if entry.mask is not None and not entry.dynamic:
            continue
        if id(entry) in local.filters:
            kept = local.verdict(snap, entry, request)
            if kept is not None:
                keep &= kept
            continue
        verdict = _verdict(snap, entry, request, keep)
        if verdict is not None:
            if only_local and entry.dynamic:
                return None
            keep &= verdict.keep
    return keep


def filter_hosts(
    snap: Snapshot,
    request: VmRequest,
    policy: LoadedPolicy,
    statics: dict[tuple[Hashable, ...], tuple[Bools, list[FilterResult]]] | None = None,
) -> tuple[list[FilterResult], Bools]:
    """Every filter of the policy on every host: their results and the hosts all keep.
    ``statics`` caches the verdicts of the filters that ignore usage, per what they read."""
    keep, results = _static_part(snap, request, policy, {} if statics is None else statics)
    keep = keep.copy()
    results = list(results)
    for entry in policy.filters:
        if entry.mask is not None and not entry.dynamic:
            continue
        verdict = _verdict(snap, entry, request, keep)
        if verdict is not None:
            results.append(FilterResult(entry.name, verdict))
            keep &= verdict.keep
    return results, keep


def _static_part(
    snap: Snapshot,
    request: VmRequest,
    policy: LoadedPolicy,
    statics: dict[tuple[Hashable, ...], tuple[Bools, list[FilterResult]]],
    values: _Values | None = None,
) -> tuple[Bools, list[FilterResult]]:
    """The verdicts of the filters that ignore usage: once per combination of the request
    fields they declare they read, or every time while one of them declares none."""
    entries = [e for e in policy.filters if e.mask is not None and not e.dynamic]
    cacheable = all(entry.reads is not None for entry in entries)
    key: tuple[Hashable, ...] = ()
    if cacheable:
        values = values or _Values()
        key = tuple(
            (entry.name, *values.of(request, sorted(entry.reads or ()))) for entry in entries
        )
        if key in statics:
            return statics[key]
    keep = np.ones(snap.size, np.bool_)
    results = []
    for entry in entries:
        assert entry.mask is not None
        # A filter whose verdict is cached sees only the fields it declared: reading
        # another one fails loudly, naming it, instead of answering from a stale cache.
        seen = (
            request
            if entry.reads is None
            else cast(VmRequest, _Fields(request, entry.name, entry.reads))
        )
        verdict = _plugin("filter", entry.name, entry.mask.mask, snap, seen)
        if verdict is not None:
            results.append(FilterResult(entry.name, verdict))
            keep &= verdict.keep
    if cacheable:
        statics[key] = (keep, results)
    return keep, results


class _Fields:
    """A request as a plugin that declared ``reads`` sees it."""

    def __init__(self, request: VmRequest, plugin: str, reads: frozenset[str] | None) -> None:
        self._request, self._plugin, self._reads = request, plugin, reads or frozenset()

    def __getattr__(self, name: str) -> Any:
        if name not in self._reads:
            raise AttributeError(
                f"plugin {self._plugin!r} read request.{name} but declares it reads only "
                f"{sorted(self._reads)}"
            )
        return getattr(self._request, name)


_PLAIN = (str, int, float, frozenset, type(None))


def _hashable(value: object) -> Hashable:
    if isinstance(value, _PLAIN):  # (first: the Mapping check is slow, and these are most)
        return value
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return cast(Hashable, value)


def _verdict(
    snap: Snapshot, entry: LoadedFilter, request: VmRequest, keep: Bools
) -> Verdict | None:
    if entry.mask is not None:
        return _plugin("filter", entry.name, entry.mask.mask, snap, request)
    assert entry.per_host is not None
    # A per-host filter only looks at the hosts the others kept, one at a time.
    rejected: dict[str, list[int]] = {}
    for host in np.flatnonzero(keep):
        view = host_view(snap, int(host), request)
        reason = _plugin("filter", entry.name, entry.per_host.filter, view, request)
        if reason is not None:
            rejected.setdefault(reason, []).append(int(host))
    checks = []
    for reason, hosts in rejected.items():
        ok = np.ones(snap.size, np.bool_)
        ok[hosts] = False
        checks.append((ok, reason))
    return Verdict(checks, snap.size)


def _pick(
    call: _Call, request: VmRequest, candidates: Ints
) -> tuple[int | None, tuple[HostScore, ...]]:
    policy, rng = call.policy, call.rng
    if len(candidates) == 0:
        return None, ()
    if policy.sample is not None and len(candidates) > policy.sample:
        # Score a random sample, as kube-scheduler (percentageOfNodesToScore) and
        # Nomad (limit iterator) do: every sampled host is feasible, and the best of a
        # few hundred random ones is as good as the best of all for spreading.
        # (Drawn with replacement: a host drawn twice changes nothing.)
        candidates = candidates[rng.integers(0, len(candidates), policy.sample)]
    if len(candidates) == 1 or not policy.weighers:
        return int(candidates[rng.integers(len(candidates))]), ()
    weighed = weigh(call.snap, request, candidates, policy.weighers, call.local)
    scores = sum((w for _, w in weighed), np.zeros(len(candidates)))
    tolerance = policy.tie_tolerance * sum(abs(m) for _, m in policy.weighers)
    near = np.flatnonzero(scores >= scores.max() - tolerance)
    if len(near) > policy.subset_size:
        best = np.argpartition(-scores[near], policy.subset_size)[: policy.subset_size]
        near = near[best]
    chosen = int(near[rng.integers(len(near))])
    breakdown = _breakdown(call.snap, candidates, chosen, weighed) if call.breakdown else ()
    return int(candidates[chosen]), breakdown


def weigh(
    snap: Snapshot,
    request: VmRequest,
    candidates: Ints,
    weighers: Sequence[tuple[Weigher, float]],
    local: _Local | None = None,
) -> list[tuple[str, Floats]]:
    """Each weigher's multiplier times its raw scores rescaled to [0, 1] over the
    candidates, as Nova does; a weigher with no opinion, or the same one for all, adds
    nothing. With ``local``, the host-local weighers' raw scores are its kept ones."""
    if not len(candidates):
        return []  # nothing fits: weighers have nothing to rank (and min() would fail)
    weighed = []
    for position, (weigher, multiplier) in enumerate(weighers):
        name = str(getattr(weigher, "name", type(weigher).__name__))
        kept, raw = (
            local.raw(snap, position, weigher, request, candidates) if local else (False, None)
        )
        if not kept:
            raw = _plugin("weigher", name, weigher.weigh, snap, request, candidates)
        if raw is None:
            continue
        low, high = float(raw.min()), float(raw.max())
        if high > low:
            weighed.append((name, multiplier * (raw - low) / (high - low)))
    return weighed


def score_rows(
    snap: Snapshot, candidates: Ints, weighed: list[tuple[str, Floats]], rows: Sequence[int]
) -> tuple[HostScore, ...]:
    """The named candidates' scores, in total and per weigher."""
    total = sum((w for _, w in weighed), np.zeros(len(candidates)))
    return tuple(
        HostScore(
            snap.names[int(candidates[i])],
            round(float(total[i]), 4),
            {name: round(float(w[i]), 4) for name, w in weighed},
        )
        for i in rows
    )


def _plugin(kind: str, name: str, call: Callable[..., T], *args: Any) -> T:
    """Call a filter or weigher; if it raises, say which one (the traceback is logged)."""
    try:
        return call(*args)
    except LoadmasterError:
        raise
    except Exception as exc:
        log.exception("%s plugin %s raised", kind, name)
        raise PluginFailed(
            f"{kind} plugin {name!r} failed ({type(exc).__name__}: {exc}); the server log "
            "has its traceback",
            field="policy" if kind == "weigher" else None,
        ) from exc
