"""The scheduler: filter, weigh, pick, claim; many VMs per call, several schedulers at once.

Decisions are made on the in-memory ``HostState`` (numpy arrays); each decided VM is
applied to it at once, so the next decision of the batch sees it (pending counts as used,
for resources and for server groups alike). Claims then go to the ledger with the host
generation each decision was based on: if another scheduler changed that host meanwhile
the claim is refused, the host is reloaded and the VM decided again (a bounded number of
times). Nothing is kept between calls but the arrays, which a refresh brings up to date.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.groups import GroupRecord, group_record
from loadmaster.cluster.vms import PLACED_STATES
from loadmaster.errors import (
    ConcurrentUpdate,
    Conflict,
    InvalidTransition,
    LoadmasterError,
    NotFound,
    PluginFailed,
    ValidationError,
)
from loadmaster.pending import Claim, ClaimOutcome, Ledger
from loadmaster.pending.ledger import CLAIM_INTENTS
from loadmaster.resources import aggregate_specs, one_numa_node
from loadmaster.scheduler.plugins import (
    LoadedFilter,
    Verdict,
    Weigher,
    host_view,
    load_filters,
    load_weighers,
)
from loadmaster.scheduler.policies import DEFAULT_POLICY, POLICIES, Policy
from loadmaster.scheduler.reports import record_report
from loadmaster.scheduler.request import RequestSpec, VmRequest, summed
from loadmaster.scheduler.results import (
    CapacityReport,
    Explanation,
    FilterCount,
    HostScore,
    NoHostFits,
    Placement,
    ScheduleResult,
)
from loadmaster.scheduler.state import Bools, HostState, Ints
from loadmaster.store import Store
from loadmaster.store.chunks import in_chunks
from loadmaster.store.schema import FlavorRow, ServerGroupRow, VmRow

log = logging.getLogger("loadmaster.scheduler")
T = TypeVar("T")
POLICY_ENV = "LOADMASTER_SCHEDULER_POLICY"
SCHEDULABLE_STATES = ("requested", "stopped", "running")


@dataclass
class _Item:
    """One VM of the batch on its way through: where it was asked, and how it went."""

    position: int
    request: VmRequest
    error: LoadmasterError | None = None
    attempts: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class _Scoring:
    """A policy made ready to use: weighers with multipliers, its scoring sample, and the
    filters it switched off."""

    weighers: list[tuple[Weigher, float]]
    sample: int | None = None
    disabled: frozenset[str] = frozenset()


@dataclass
class _Decision:
    host: int | None
    verdicts: list[tuple[str, Verdict]]


class Scheduler:
    """``lm.scheduler``: see ``schedule``, ``capacity`` and ``explain``.

    ``claim_chunk`` claims go to the ledger per transaction in best-effort mode.
    ``max_attempts`` bounds how often one VM is decided again after losing a claim race.
    ``max_vms_per_call`` bounds the VMs of one ``schedule`` call (default 10,000; the API
    keeps the default, a benchmark placing more in one call raises it).
    Among the hosts scoring within ``tie_tolerance`` (a fraction of the summed multipliers)
    of the best, one of the ``subset_size`` best is drawn at random, so schedulers running
    side by side spread out instead of all claiming the same host. Each ``schedule`` call
    draws from its own generator, seeded by the call's ``seed`` (or a fresh one drawn from
    the scheduler's ``seed``), and the result records it: the same seed on the same state
    makes the same choices, dry run or real.
    """

    def __init__(
        self,
        store: Store,
        *,
        default_policy: str | None = None,
        policies: Mapping[str, Policy] | None = None,
        claim_chunk: int = 500,
        max_attempts: int = 5,
        subset_size: int = 100,
        tie_tolerance: float = 0.01,
        seed: int | None = None,
        max_vms_per_call: int | None = None,
    ) -> None:
        self._store = store
        self._settings: dict[str, Any] = {
            "default_policy": default_policy,
            "policies": policies,
            "claim_chunk": claim_chunk,
            "max_attempts": max_attempts,
            "subset_size": subset_size,
            "tie_tolerance": tie_tolerance,
            "seed": seed,
            "max_vms_per_call": max_vms_per_call,
        }
        self._max_vms = max_vms_per_call or MAX_VMS_PER_CALL
        # Read-only questions (dry runs, capacity, explain) go to a twin with its own host
        # arrays and lock, so they never wait behind a batch that is claiming.
        self._reader: Scheduler | None = None
        self._reader_lock = threading.Lock()
        self._reads_only = False
        # The scheduler decides again itself after a lost race, so the ledger need not
        # retry a stale claim many times over.
        self._ledger = Ledger(store, conflict_retries=2)
        self._hosts = HostState(store)
        self.policies: dict[str, Policy] = {**POLICIES, **(policies or {})}
        self.default_policy = self._policy(
            default_policy or os.environ.get(POLICY_ENV) or DEFAULT_POLICY, "default_policy"
        ).name
        self._claim_chunk = claim_chunk
        self._max_attempts = max_attempts
        self._subset_size = subset_size
        self._tie_tolerance = tie_tolerance
        # Seeds of calls that bring none; each call then draws from its own generator.
        self._seeds = np.random.default_rng(seed)
        self._rng = np.random.default_rng(seed)
        self._filters: list[LoadedFilter] | None = None
        self._statics: dict[frozenset[str], list[LoadedFilter]] = {}
        self._scorings: dict[str, _Scoring] = {}
        self._static: dict[tuple[Hashable, ...], tuple[Bools, list[tuple[str, Verdict]]]] = {}
        self._groups: dict[str, GroupRecord] = {}
        self._move_pending = False
        # Hard-affinity members of the batch that leave a host (migrate, re-placed): the
        # group follows them, so they must not pin it to where they are leaving.
        self._leaving: dict[str, list[int]] = {}
        self._intent: str | None = None
        # One decision at a time per Scheduler object: the arrays are not thread-safe.
        self._lock = threading.RLock()

    # -- public API --------------------------------------------------------------------
    def schedule(
        self,
        requests: Sequence[RequestSpec],
        *,
        gang: bool = False,
        dry_run: bool = False,
        policy: str | None = None,
        move_pending: bool = False,
        intent: str | None = None,
        seed: int | None = None,
    ) -> ScheduleResult:
        """Place every VM of ``requests``. ``gang``: all of them or none (nothing is claimed
        unless every VM has a host). ``dry_run``: decide the same way, claim nothing.
        ``move_pending``: a VM pending on a host (claimed, not started) is re-placed
        elsewhere in the claim's transaction (a drain) instead of being refused.
        ``intent`` ("start" or "migrate", see ``Claim``) refuses VMs in the other state,
        here and again in the ledger under the VM's row lock. ``seed`` (0 to 2**63 - 1)
        replays a decision: the result's ``seed`` given again on the same state chooses
        the same hosts. Failures come back per VM in the result; bad requests raise."""
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED
        ):
            raise ValidationError(
                f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}", field="seed"
            )
        if dry_run and not self._reads_only:
            return self._for_reads().schedule(
                requests, gang=gang, dry_run=True, policy=policy, intent=intent, seed=seed
            )
        if not dry_run and self._reads_only:
            raise ValidationError("this scheduler only answers dry runs", field="dry_run")
        started = time.perf_counter()
        chosen = self._policy(policy or self.default_policy, "policy")
        if intent not in CLAIM_INTENTS:
            raise ValidationError(
                f"intent must be start or migrate, got {intent!r}", field="intent"
            )
        _check_size(requests, self._max_vms)
        with self._lock:
            if seed is None:
                seed = int(self._seeds.integers(MAX_SEED, endpoint=True))
            self._rng = np.random.default_rng(seed)
            self._move_pending = move_pending
            self._begin()
            self._intent = intent
            items = self._resolve(requests, dry_run)
            scoring = self._scoring(chosen)
            if gang:
                placements, conflicts = self._gang(items, scoring, dry_run)
            else:
                placements, conflicts = self._best_effort(items, scoring, dry_run)
        placements.sort(key=lambda pair: pair[0])
        return ScheduleResult(
            tuple(p for _, p in placements),
            gang=gang,
            dry_run=dry_run,
            policy=chosen.name,
            conflicts=conflicts,
            seconds=time.perf_counter() - started,
            seed=seed,
        )

    def explain(
        self, request: RequestSpec, *, policy: str | None = None, seed: int | None = None
    ) -> Explanation:
        """Why hosts are ruled out for the request, right now. The request is decided as
        a dry run with ``policy`` and ``seed`` decides it, so the answer agrees with that
        run: the first VM that would fit nowhere, explained as its failure is (a group
        too big for any host, a group rule that leaves no host); when every VM fits, the
        first one, with how many hosts fit it."""
        if not self._reads_only:
            return self._for_reads().explain(request, policy=policy, seed=seed)
        result = self.schedule([request], dry_run=True, policy=policy, seed=seed)
        for placement in result.placements:
            if placement.explanation is not None:
                return placement.explanation
            if placement.error is not None:
                raise placement.error
        with self._lock:
            self._begin()
            first = self._ordered(self._resolve([request], dry_run=True))[0]
            scoring = self._scoring(self._policy(policy or self.default_policy, "policy"))
            decision = self._decide(first.request, _Scoring([], disabled=scoring.disabled))
            return self._explanation(first.request, decision, scoring)

    def capacity(
        self, flavor: str, *, group: str | None = None, policy: str | None = None, **spec: Any
    ) -> CapacityReport:
        """How many more VMs of ``flavor`` fit now, and on which hosts (best first by
        ``policy``). Extra keywords are ``RequestSpec`` fields (traits, member_of, ...).
        With a hard-affinity group all of them must share one host, so ``total`` is the
        most any single host takes."""
        if not self._reads_only:
            return self._for_reads().capacity(flavor, group=group, policy=policy, **spec)
        chosen = self._policy(policy or self.default_policy, "policy")
        with self._lock:
            self._begin()
            item = self._resolve([RequestSpec(flavor=flavor, group=group, **spec)], True)[0]
            request = item.request
            decision = self._decide(request, _Scoring([]))
            hosts = self._hosts
            counts = self._fitting_count(request)
            keep = np.ones(hosts.size, np.bool_)
            for _, verdict in decision.verdicts:
                keep &= verdict.keep
            counts[~keep] = 0
            if request.group is not None:
                members = hosts.group_members[request.group.name]
                cap = request.group.max_per_host or (
                    1 if request.group.policy == "anti-affinity" else None
                )
                if cap is not None:
                    counts = np.minimum(counts, np.maximum(cap - members, 0))
            hard_affinity = request.group is not None and request.group.policy == "affinity"
            total = int(counts.max(initial=0) if hard_affinity else counts.sum())
            candidates = np.flatnonzero(counts)
            scores = self._scores(request, candidates, self._scoring(chosen).weighers)
            # Most VMs first; among hosts taking as many, the policy's best first.
            order = np.lexsort((-scores, -counts[candidates]))
            per_host = {hosts.names[h]: int(counts[h]) for h in candidates[order]}
            limits = {
                hosts.names[h]: self._zero_reason(request, decision, int(h))
                for h in np.flatnonzero(counts == 0)
            }
        return CapacityReport(flavor, total, per_host, group, dict(sorted(limits.items())))

    def _zero_reason(self, request: VmRequest, decision: _Decision, host: int) -> str:
        """Why not one more VM of the request fits on ``host``: the first filter that
        rejects it (a class short by how much, rather than only "short of"), else the
        group's cap on the host."""
        for name, verdict in decision.verdicts:
            if not verdict.keep[host]:
                reason = verdict.reason_at(host)
                if name == "resources":
                    return self._shortfall(request, host) or reason
                return reason
        group = request.group
        if group is not None:
            return f"group {group.name} is at its limit on this host"
        return self._shortfall(request, host) or "no room for one more"

    def _shortfall(self, request: VmRequest, host: int) -> str | None:
        hosts = self._hosts
        short = []
        for name, amount in sorted(request.resources.items()):
            column = hosts.classes.get(name)
            if column is None or not hosts.host_capacity[column, host]:
                short.append(f"no {name} inventory")
                continue
            free = int(hosts.host_capacity[column, host] - hosts.host_used[column, host])
            if free < amount:
                short.append(f"{name} short by {amount - free} (free {max(free, 0)} of {amount})")
                continue
            rows = hosts.tree[host]
            if not (hosts.capacity[column, rows] - hosts.used[column, rows] >= amount).any():
                short.append(f"{name}: no one provider of the host has {amount} free")
            elif not hosts.unit_ok(column, amount)[rows].any():
                short.append(f"{name} unit rules (min, max, step) refuse {amount}")
        return "; ".join(short) or None

    def refresh(self) -> None:
        """Bring the in-memory host state up to date now (every call does it anyway; a
        server calls this at start so the first request does not pay the full load)."""
        with self._lock:
            self._hosts.refresh()

    def record_report(
        self,
        host: str,
        usage: Mapping[str, float],
        load: Mapping[str, float],
        running_vms: Sequence[str],
    ) -> None:
        """Store a host agent's latest measurements (see ``reports.record_report``)."""
        record_report(self._store, host, usage, load, running_vms)

    # -- setting up a call ---------------------------------------------------------------
    def _for_reads(self) -> Scheduler:
        """The twin that answers read-only questions (made on first use)."""
        with self._reader_lock:
            if self._reader is None:
                reader = Scheduler(self._store, **self._settings)
                reader.policies = self.policies
                reader.default_policy = self.default_policy
                reader._reads_only = True
                self._reader = reader
            return self._reader

    def _policy(self, name: str, field: str) -> Policy:
        if name not in self.policies:
            raise ValidationError(
                f"{field} {name!r} is not a policy (known: {', '.join(sorted(self.policies))})",
                field=field,
            )
        return self.policies[name]

    def _scoring(self, policy: Policy) -> _Scoring:
        if policy.name not in self._scorings:
            known = {f.name for f in self._loaded_filters()}
            unknown = sorted(set(policy.disabled_filters) - known)
            if unknown:
                raise ValidationError(
                    f"policy {policy.name!r} disables filter {unknown[0]!r}, which is not "
                    f"registered (known: {', '.join(sorted(known))})",
                    field="policy",
                )
            self._scorings[policy.name] = _Scoring(
                load_weighers(policy.weighers), policy.sample, frozenset(policy.disabled_filters)
            )
        return self._scorings[policy.name]

    def _begin(self) -> None:
        self._hosts.refresh()
        self._static.clear()
        self._intent = None

    def _resolve(self, requests: Sequence[RequestSpec], dry_run: bool) -> list[_Item]:
        if not requests:
            raise ValidationError("requests must name at least one VM to place", field="requests")
        for i, spec in enumerate(requests):
            if not isinstance(spec, RequestSpec):
                raise ValidationError(
                    f"requests[{i}] must be a RequestSpec", field=f"requests[{i}]"
                )
            spec.check(f"requests[{i}]")
            if spec.flavor is not None and not dry_run:
                raise ValidationError(
                    f"requests[{i}].flavor: a flavor request has no VM to claim for; create the "
                    "VMs first, or ask with dry_run (or capacity)",
                    field=f"requests[{i}].flavor",
                )
        items: list[_Item] = []
        groups: dict[str, GroupRecord] = {}
        self._leaving = {}
        with self._store.read() as session:
            for i, spec in enumerate(requests):
                items.extend(self._resolve_one(session, spec, f"requests[{i}]", len(items), groups))
        seen: set[str] = set()
        for item in items:
            vm = item.request.vm
            if vm is not None and vm in seen:
                raise ValidationError(f"vm {vm} appears twice in one call", field="requests")
            seen.add(vm or "")
        self._groups = groups
        self._load_groups()
        if groups:
            self._count_group_sizes(items)
        return items

    def _count_group_sizes(self, items: list[_Item]) -> None:
        """Each request learns how many VMs its group holds once the call is done: the
        members placed now and those of the call (counted once if both)."""
        members: dict[str, set[str]] = {name: set() for name in self._groups}
        with self._store.read() as session:
            for name, uuid in session.execute(
                select(ServerGroupRow.name, VmRow.uuid)
                .join(VmRow, VmRow.group_id == ServerGroupRow.id)
                .where(ServerGroupRow.name.in_(members), VmRow.state.in_(PLACED_STATES))
            ):
                members[name].add(uuid)
        for item in items:
            group = item.request.group
            if group is not None and item.error is None:
                members[group.name].add(item.request.vm or f"#{item.position}")
        for item in items:
            group = item.request.group
            if group is not None:
                item.request.group_size = len(members[group.name])

    def _resolve_one(
        self,
        session: Session,
        spec: RequestSpec,
        where: str,
        position: int,
        groups: dict[str, GroupRecord],
    ) -> list[_Item]:
        lookup.require_traits(session, spec.required_traits, f"{where}.required_traits")
        lookup.require_traits(session, spec.forbidden_traits, f"{where}.forbidden_traits")
        lookup.require_classes(session, spec.overrides, f"{where}.overrides")
        for attr in ("include_hosts", "exclude_hosts"):
            for j, host in enumerate(getattr(spec, attr) or ()):
                if host not in self._hosts.index:
                    raise NotFound(
                        f"{where}.{attr}[{j}] {host!r}: no such host", field=f"{where}.{attr}[{j}]"
                    )
        group = None
        if spec.group is not None:
            group = group_record(lookup.group_row(session, spec.group, f"{where}.group"))
            groups[group.name] = group
        base = VmRequest(
            vm=None,
            label="",
            flavor="",
            resources={},
            required_traits=frozenset(spec.required_traits),
            forbidden_traits=frozenset(spec.forbidden_traits),
            member_of=tuple(frozenset(m) for m in spec.member_of),
            forbidden_aggregates=frozenset(spec.forbidden_aggregates),
            group=group,
            include_hosts=None if spec.include_hosts is None else frozenset(spec.include_hosts),
            exclude_hosts=frozenset(spec.exclude_hosts),
        )
        if spec.flavor is not None:
            flavor = lookup.flavor_row(session, spec.flavor, f"{where}.flavor")
            request = _with_flavor(base, flavor, spec.overrides)
            return [
                _Item(position + n, replace(request, label=f"{flavor.name}#{n}"))
                for n in range(spec.count or 1)
            ]
        return self._resolve_vms(session, spec, where, position, base, groups)

    def _resolve_vms(
        self,
        session: Session,
        spec: RequestSpec,
        where: str,
        position: int,
        base: VmRequest,
        groups: dict[str, GroupRecord],
    ) -> list[_Item]:
        rows: dict[str, VmRow] = {}
        given = list(spec.vms)
        uuids = [lookup.canonical_uuid(u) for u in given]
        row: VmRow | None
        for chunk in in_chunks(uuids):
            for row in session.scalars(select(VmRow).where(VmRow.uuid.in_(chunk))):
                rows[row.uuid] = row
        flavors = {
            f.id: f
            for f in session.scalars(
                select(FlavorRow).where(FlavorRow.id.in_({r.flavor_id for r in rows.values()}))
            )
        }
        group_rows = {
            g.id: g
            for g in session.scalars(
                select(ServerGroupRow).where(
                    ServerGroupRow.id.in_({r.group_id for r in rows.values() if r.group_id})
                )
            )
        }
        items = []
        for j, uuid in enumerate(uuids):
            row = rows.get(uuid)
            if row is None:
                raise NotFound(
                    f"{where}.vms[{j}] {given[j]!r}: no such VM", field=f"{where}.vms[{j}]"
                )
            group = base.group
            if row.group_id is not None:
                own = group_record(group_rows[row.group_id])
                if group is not None and group.name != own.name:
                    raise ValidationError(
                        f"{where}.group {group.name!r}: VM {uuid} belongs to group {own.name}",
                        field=f"{where}.group",
                    )
                group = groups.setdefault(own.name, own)
            flavor = flavors.get(row.flavor_id) if row.flavor_id is not None else None
            request = replace(
                _with_flavor(base, flavor, row.overrides) if flavor is not None else base,
                group=group,
            )
            request.vm = request.label = row.uuid
            error: LoadmasterError | None = None
            movable = SCHEDULABLE_STATES + (("pending",) if self._move_pending else ())
            if row.state not in movable or flavor is None:
                error = InvalidTransition(
                    f"VM {uuid} is {row.state}; only a requested, stopped or running VM can be "
                    "placed",
                    field=f"{where}.vms[{j}]",
                )
            elif self._intent == "start" and row.state == "running":
                error = InvalidTransition(
                    f"VM {uuid} is already running on its host; to move it, migrate it",
                    field=f"{where}.vms[{j}]",
                )
            elif self._intent == "migrate" and row.state != "running":
                error = InvalidTransition(
                    f"VM {uuid} is {row.state}; only a running VM migrates",
                    field=f"{where}.vms[{j}]",
                )
            elif row.state in ("running", "pending") and row.host_id is not None:
                # Scheduling a running VM is a live migration (a pending one is re-placed):
                # anywhere but where it is.
                current = self._hosts.root_of[self._hosts.row_of[row.host_id]]
                request.exclude_hosts = request.exclude_hosts | {self._hosts.names[current]}
                if group is not None and group.policy == "affinity":
                    self._leaving.setdefault(group.name, []).append(int(current))
            items.append(_Item(position + j, request, error))
        return items

    # -- deciding ------------------------------------------------------------------------
    def _decide(self, request: VmRequest, scoring: _Scoring) -> _Decision:
        keep, static = self._static_part(request, scoring.disabled)
        keep = keep.copy()
        verdicts = list(static)
        for entry in self._loaded_filters():
            if (entry.mask is not None and not entry.dynamic) or entry.name in scoring.disabled:
                continue
            verdict = self._verdict(entry, request, keep)
            if verdict is not None:
                verdicts.append((entry.name, verdict))
                keep &= verdict.keep
        candidates = np.flatnonzero(keep)
        if len(candidates) == 0:
            return _Decision(None, verdicts)
        sample, weighers = scoring.sample, scoring.weighers
        if sample is not None and len(candidates) > sample:
            # Score a random sample, as kube-scheduler (percentageOfNodesToScore) and
            # Nomad (limit iterator) do: every sampled host is feasible, and the best of a
            # few hundred random ones is as good as the best of all for spreading.
            # (Drawn with replacement: a host drawn twice changes nothing.)
            candidates = candidates[self._rng.integers(0, len(candidates), sample)]
        if len(candidates) == 1 or not weighers:
            return _Decision(int(candidates[self._rng.integers(len(candidates))]), verdicts)
        scores = self._scores(request, candidates, weighers)
        tolerance = self._tie_tolerance * sum(abs(m) for _, m in weighers)
        near = np.flatnonzero(scores >= scores.max() - tolerance)
        if len(near) > self._subset_size:
            best = np.argpartition(-scores[near], self._subset_size)[: self._subset_size]
            near = near[best]
        return _Decision(int(candidates[near[self._rng.integers(len(near))]]), verdicts)

    def _static_part(
        self, request: VmRequest, disabled: frozenset[str]
    ) -> tuple[Bools, list[tuple[str, Verdict]]]:
        """The verdicts of the filters that ignore the batch's own claims: computed once
        per combination of their signatures, or every time while one of them has none."""
        statics = self._statics.get(disabled)
        if statics is None:  # once per policy: this runs for every VM decided
            statics = self._statics[disabled] = [
                entry
                for entry in self._loaded_filters()
                if entry.mask is not None and not entry.dynamic and entry.name not in disabled
            ]
        cacheable = all(entry.signature is not None for entry in statics)
        key: tuple[Hashable, ...] = (
            disabled,
            *((entry.name, entry.signature(request)) for entry in statics if entry.signature),
        )
        if cacheable and key in self._static:
            return self._static[key]
        keep = np.ones(self._hosts.size, np.bool_)
        verdicts = []
        for entry in statics:
            assert entry.mask is not None
            verdict = _plugin("filter", entry.name, entry.mask.mask, self._hosts, request)
            if verdict is not None:
                verdicts.append((entry.name, verdict))
                keep &= verdict.keep
        if cacheable:
            self._static[key] = (keep, verdicts)
        return keep, verdicts

    def _loaded_filters(self) -> list[LoadedFilter]:
        if self._filters is None:
            self._filters = load_filters()
        return self._filters

    def _verdict(self, entry: LoadedFilter, request: VmRequest, keep: Bools) -> Verdict | None:
        if entry.mask is not None:
            return _plugin("filter", entry.name, entry.mask.mask, self._hosts, request)
        assert entry.per_host is not None
        # A per-host filter only looks at the hosts the others kept, one at a time.
        rejected: dict[str, list[int]] = {}
        for host in np.flatnonzero(keep):
            view = host_view(self._hosts, int(host), request)
            reason = _plugin("filter", entry.name, entry.per_host.filter, view, request)
            if reason is not None:
                rejected.setdefault(reason, []).append(int(host))
        checks = []
        for reason, hosts in rejected.items():
            ok = np.ones(self._hosts.size, np.bool_)
            ok[hosts] = False
            checks.append((ok, reason))
        return Verdict(checks, self._hosts.size)

    def _scores(
        self, request: VmRequest, candidates: Ints, weighers: list[tuple[Weigher, float]]
    ) -> np.ndarray:
        scores = np.zeros(len(candidates))
        for _, weighted in self._weighed(request, candidates, weighers):
            scores += weighted
        return scores

    def _weighed(
        self, request: VmRequest, candidates: Ints, weighers: list[tuple[Weigher, float]]
    ) -> list[tuple[str, np.ndarray]]:
        """Each weigher's multiplier times its raw scores rescaled to [0, 1] over the
        candidates, as Nova does; a weigher with no opinion, or the same one for all, adds
        nothing."""
        if not len(candidates):
            return []  # nothing fits: weighers have nothing to rank (and min() would fail)
        weighed = []
        for weigher, multiplier in weighers:
            name = str(getattr(weigher, "name", type(weigher).__name__))
            raw = _plugin("weigher", name, weigher.weigh, self._hosts, request, candidates)
            if raw is None:
                continue
            low, high = float(raw.min()), float(raw.max())
            if high > low:
                weighed.append((name, multiplier * (raw - low) / (high - low)))
        return weighed

    def _ranking(
        self, request: VmRequest, candidates: Ints, scoring: _Scoring, top: int = 5
    ) -> tuple[HostScore, ...]:
        weighed = self._weighed(request, candidates, scoring.weighers)
        total = sum((w for _, w in weighed), np.zeros(len(candidates)))
        best = np.argsort(-total, kind="stable")[:top]
        return tuple(
            HostScore(
                self._hosts.names[int(candidates[i])],
                round(float(total[i]), 4),
                {name: round(float(w[i]), 4) for name, w in weighed},
            )
            for i in best
        )

    def _explanation(
        self, request: VmRequest, decision: _Decision, scoring: _Scoring | None = None
    ) -> Explanation:
        remaining = np.ones(self._hosts.size, np.bool_)
        counts = []
        for name, verdict in decision.verdicts:
            removed = remaining & ~verdict.keep
            if removed.any():
                counts.append(FilterCount(name, int(removed.sum()), verdict.blame(removed)))
            remaining &= verdict.keep
        candidates = int(remaining.sum())
        headline = None if candidates else self._group_headline(request, decision)
        ranking = (
            self._ranking(request, np.flatnonzero(remaining), scoring)
            if candidates and scoring is not None
            else ()
        )
        return Explanation(
            request.label,
            self._hosts.size,
            candidates,
            tuple(counts),
            headline=headline,
            ranking=ranking,
        )

    def _group_headline(self, request: VmRequest, decision: _Decision) -> str | None:
        """When a hard group rule is what leaves no host, say so in the group's terms: the
        per-filter counts alone blame resources (a group too big for any one host) or the
        group filter without saying how far off the group is."""
        group = request.group
        if group is None:
            return None
        hosts = self._hosts
        if group.policy == "affinity" and request.companions:
            others = _kept(decision, but="resources")
            if not others.any():
                return None
            fit = self._members_fitting(request, others)
            best = int(np.argmax(fit))
            # What stops the best host taking one member more than it does.
            one_more = summed(request.companions[: fit[best]])
            limits = [
                name
                for name, ok in sorted(hosts.fits(request.resources, one_more).items())
                if not ok[best]
            ]
            limited = f" (limited by {', '.join(limits)})" if limits else ""
            size = len(request.companions) + 1
            return (
                f"hard affinity group {group.name} needs {size} VMs on one host; "
                f"the best host {hosts.names[best]} fits {fit[best]}{limited}"
            )
        rule = "anti_affinity" if group.policy == "anti-affinity" else "max_per_host"
        if rule not in (name for name, _ in decision.verdicts):
            return None
        # A host the group filled is often full by resources too (its members use them):
        # the rule is the reason when every host the remaining filters keep holds its
        # share of members already.
        others = _kept(decision, but=(rule, "resources"))
        if not others.any():
            return None
        cap = group.max_per_host or 1
        members = hosts.group_members.get(group.name)
        if members is None or (members[others] < cap).any():
            return None
        needed = -(-request.group_size // cap)
        return (
            f"{group.policy} group {group.name} (at most {cap} per host) needs {needed} hosts "
            f"for its {request.group_size} VMs; 0 are left: the {int(others.sum())} hosts that "
            f"pass the other filters hold {cap} already"
        )

    def _members_fitting(self, request: VmRequest, keep: Bools) -> Ints:
        """Per host, how many members of the request's group (the request, then its
        companions in order) fit together, as the resources filter counts them; 0 outside
        ``keep``."""
        fit = np.zeros(self._hosts.size, np.int64)
        ok = keep.copy()
        for n in range(1, len(request.companions) + 2):
            companions = summed(request.companions[: n - 1])
            for fits in self._hosts.fits(request.resources, companions).values():
                ok &= fits
            if not ok.any():
                break
            fit[ok] = n
        return fit

    def _fitting_count(self, request: VmRequest) -> Ints:
        """Per host, how many copies of the request fit by resources (unit rules included)."""
        hosts = self._hosts
        counts = np.full(hosts.size, np.iinfo(np.int64).max, np.int64)
        for name, amount in request.resources.items():
            column = hosts.classes.get(name)
            if column is None:
                return np.zeros(hosts.size, np.int64)
            free = np.maximum(hosts.capacity[column] - hosts.used[column], 0)
            unit_ok = hosts.unit_ok(column, amount)
            per_provider = np.where(unit_ok, free // amount, 0)
            per_host = (
                per_provider
                if hosts.flat
                else np.bincount(hosts.root_of, weights=per_provider, minlength=hosts.size).astype(
                    np.int64
                )
            )
            counts = np.minimum(counts, per_host)
        if request.one_numa_node:
            counts = np.minimum(counts, hosts.one_node_counts(request.resources))
        return counts

    # -- one batch, two modes ------------------------------------------------------------
    def _ordered(self, items: list[_Item]) -> list[_Item]:
        """Members of a hard-affinity group move up to their first member, and that member
        carries the others' resources as companions, so the group lands together."""
        order: list[_Item] = []
        bunches: dict[str, list[_Item]] = {}
        for item in items:
            group = item.request.group
            if item.error is None and group is not None and group.policy == "affinity":
                if group.name not in bunches:
                    bunches[group.name] = []
                    order.append(item)
                bunches[group.name].append(item)
            else:
                order.append(item)
        out: list[_Item] = []
        for item in order:
            group = item.request.group
            bunch = bunches.get(group.name, []) if group is not None else []
            if bunch and bunch[0] is item:
                item.request.companions = tuple(other.request.resources for other in bunch[1:])
                out.extend(bunch)
            else:
                out.append(item)
        return out

    def _decide_item(
        self, item: _Item, scoring: _Scoring
    ) -> tuple[int | None, NoHostFits | PluginFailed | None]:
        started = time.perf_counter()
        try:
            decision = self._decide(item.request, scoring)
        except PluginFailed as exc:
            item.seconds += time.perf_counter() - started
            return None, exc  # this VM fails, naming the plugin; the batch goes on
        error: NoHostFits | PluginFailed | None = None
        if decision.host is None:
            error = NoHostFits(self._explanation(item.request, decision))
        else:
            group = item.request.group
            self._hosts.apply(
                decision.host,
                item.request.resources,
                group.name if group is not None else None,
                one_node=item.request.one_numa_node,
            )
        item.seconds += time.perf_counter() - started
        return decision.host, error

    def _gang(
        self, items: list[_Item], scoring: _Scoring, dry_run: bool
    ) -> tuple[list[tuple[int, Placement]], int]:
        hosts = self._hosts
        for item in items:
            if item.error is not None:
                return self._abort(items, item, item.error), 0
        ordered = self._ordered(items)
        conflicts = 0
        for attempt in range(1, self._max_attempts + 1):
            saved = hosts.checkpoint()
            chosen: list[tuple[_Item, int, int]] = []
            for item in ordered:
                item.attempts = attempt
                host, error = self._decide_item(item, scoring)
                if error is not None:
                    hosts.restore(saved)
                    return self._abort(items, item, error), conflicts
                assert host is not None
                chosen.append((item, host, hosts.root_generation(host)))
            if dry_run:
                hosts.restore(saved)
                return [self._placed(item, host) for item, host, _ in chosen], conflicts
            try:
                self._ledger.claim_many(self._claims(chosen), all_or_nothing=True)
            except LoadmasterError as exc:
                hosts.restore(saved)
                if not _lost_race(exc):
                    return self._abort(items, None, exc), conflicts
                # Another scheduler changed a chosen host: decide again on the store's view.
                conflicts += 1
                self._reload()
                continue
            hosts.committed(host for _, host, _ in chosen)
            return [self._placed(item, host) for item, host, _ in chosen], conflicts
        gave_up = ConcurrentUpdate(
            f"gang of {len(items)} VMs lost the race for its hosts {self._max_attempts} times "
            "to other schedulers; nothing was claimed, try again",
            field="requests",
        )
        return self._abort(items, None, gave_up), conflicts

    def _best_effort(
        self, items: list[_Item], scoring: _Scoring, dry_run: bool
    ) -> tuple[list[tuple[int, Placement]], int]:
        hosts = self._hosts
        out = [self._failed(item) for item in items if item.error is not None]
        queue = deque(self._ordered([item for item in items if item.error is None]))
        saved = hosts.checkpoint() if dry_run else None
        # A hard-affinity group whose first member (carrying the rest) fits nowhere fails
        # as a whole rather than landing in pieces.
        unplaceable: dict[str, Explanation] = {}
        conflicts = 0
        while queue:
            chosen: list[tuple[_Item, int, int]] = []
            while queue and len(chosen) < self._claim_chunk:
                item = queue.popleft()
                item.attempts += 1
                group = item.request.group
                if group is not None and group.name in unplaceable:
                    item.error = NoHostFits(replace(unplaceable[group.name], vm=item.request.label))
                    out.append(self._failed(item))
                    continue
                host, error = self._decide_item(item, scoring)
                if error is not None:
                    if (
                        isinstance(error, NoHostFits)
                        and group is not None
                        and item.request.companions
                    ):
                        unplaceable[group.name] = error.explanation
                    item.error = error
                    out.append(self._failed(item))
                    continue
                assert host is not None
                chosen.append((item, host, hosts.root_generation(host)))
            if dry_run:
                out.extend(self._placed(item, host) for item, host, _ in chosen)
                continue
            retry = self._persist(chosen, out)
            if retry:
                conflicts += len(retry)
                self._reload()
                queue.extendleft(reversed(retry))
        if saved is not None:
            hosts.restore(saved)
        return out, conflicts

    def _persist(
        self, chosen: list[tuple[_Item, int, int]], out: list[tuple[int, Placement]]
    ) -> list[_Item]:
        """Claim one chunk; record what landed, return the VMs to decide again."""
        if not chosen:
            return []
        claims = self._claims(chosen)
        try:
            outcomes = self._ledger.claim_many(claims, all_or_nothing=False)
        except ConcurrentUpdate as exc:
            outcomes = [ClaimOutcome(c.vm, c.host, error=exc) for c in claims]
        landed, missed, retry = [], set(), []
        clocks = {o.clock for o in outcomes if o.error is None}
        for (item, host, _), outcome in zip(chosen, outcomes, strict=True):
            if outcome.error is None:
                landed.append(host)
                out.append(self._placed(item, host))
                continue
            missed.add(host)
            if _lost_race(outcome.error) and item.attempts < self._max_attempts:
                retry.append(item)
                continue
            item.error = outcome.error
            if _lost_race(outcome.error):
                item.error = ConcurrentUpdate(
                    f"VM {item.request.label}: gave up after {item.attempts} claims lost to "
                    f"other schedulers; last: {outcome.error.detail}",
                    field="vm",
                )
            out.append(self._failed(item))
        # A drain's re-placed VMs also left hosts this snapshot did not update: read all.
        clock = clocks.pop() if len(clocks) == 1 and not self._move_pending else None
        self._hosts.committed(landed, clock)
        # What we applied for the claims that did not land must not linger in the arrays.
        self._hosts.refresh_hosts(missed)
        if missed and self._groups:
            # A member counted where its claim failed would mislead the next decision.
            self._load_groups()
        return retry

    def _claims(self, chosen: list[tuple[_Item, int, int]]) -> list[Claim]:
        # Not pinned to the generations the decision saw: the ledger checks capacity and
        # group rules again under the hosts' and groups' locks, so a stale view can only
        # cost a refusal (decided again), never an overcommit. Pinning made every agent's
        # "up" (which changes no usage but moves the generation) fail whole batches of a
        # mass start on PostgreSQL, as Placement's provider generations do for Nova.
        return [
            Claim(
                item.request.vm or "",
                self._hosts.names[host],
                move=self._move_pending,
                intent=self._intent,
            )
            for item, host, _generation in chosen
        ]

    def _reload(self) -> None:
        self._hosts.refresh()
        self._load_groups()

    def _load_groups(self) -> None:
        self._hosts.load_groups(self._groups.values())
        for name, leaving in self._leaving.items():
            counts = self._hosts.group_members[name]
            np.subtract.at(counts, leaving, 1)
            np.maximum(counts, 0, out=counts)
        # The static verdicts describe the hosts as they were: a host created or put in
        # maintenance since would be missing (arrays of another size) or still chosen.
        self._static.clear()

    def _abort(
        self, items: list[_Item], culprit: _Item | None, cause: LoadmasterError
    ) -> list[tuple[int, Placement]]:
        """A gang fails as one: the culprit keeps its own error, the others say why."""
        for item in items:
            item.error = (
                cause
                if item is culprit
                else Conflict(
                    f"not placed: the gang was abandoned ({cause.detail})", field="requests"
                )
            )
        return [self._failed(item) for item in items]

    def _failed(self, item: _Item) -> tuple[int, Placement]:
        return item.position, Placement(
            item.request.label, None, item.error, item.seconds, item.attempts
        )

    def _placed(self, item: _Item, host: int) -> tuple[int, Placement]:
        return item.position, Placement(
            item.request.label, self._hosts.names[host], None, item.seconds, item.attempts
        )


# Limits on one /schedule call. An operator places a rack or a region's worth of VMs at
# once, not a million: 10,000 VMs decide in seconds and answer in a few MB. Bigger
# questions ("how many fit?") have GET /capacity, which counts without placing one by one.
MAX_VMS_PER_CALL = 10_000
MAX_SEED = 2**63 - 1


def _check_size(requests: Sequence[RequestSpec], limit: int) -> None:
    total = 0
    for i, spec in enumerate(requests):
        if isinstance(spec, RequestSpec):
            # A flavor request without a count places one hypothetical VM.
            total += spec.count if isinstance(spec.count, int) else len(spec.vms or ()) or 1
        if total > limit:
            raise ValidationError(
                f"requests[{i}]: one call places at most {limit} VMs in all "
                "(ask GET /capacity how many fit)",
                field=f"requests[{i}]",
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
            f"{kind} plugin {name!r} failed ({type(exc).__name__}); the server log has "
            "its traceback",
            field="policy" if kind == "weigher" else None,
        ) from exc


def _kept(decision: _Decision, but: str | tuple[str, ...]) -> Bools:
    """The hosts every filter of the decision keeps, ``but`` the ones named."""
    left_out = (but,) if isinstance(but, str) else but
    size = len(decision.verdicts[0][1].keep) if decision.verdicts else 0
    keep = np.ones(size, np.bool_)
    for name, verdict in decision.verdicts:
        if name not in left_out:
            keep &= verdict.keep
    return keep


def _lost_race(error: LoadmasterError) -> bool:
    """Errors a fresher view of the hosts can cure: a changed generation, a host that
    filled up, left service or was deleted meanwhile. A VM in the wrong state cannot be
    cured so."""
    if isinstance(error, NotFound):
        return (error.field or "").endswith("host")
    return isinstance(error, Conflict) and not isinstance(error, InvalidTransition)


def _with_flavor(base: VmRequest, flavor: FlavorRow, overrides: Mapping[str, int]) -> VmRequest:
    member_of, forbidden_aggregates = aggregate_specs(flavor.extra_specs)
    return replace(
        base,
        flavor=flavor.name,
        resources=lookup.effective_resources(flavor.resources, overrides),
        required_traits=base.required_traits | frozenset(flavor.required_traits),
        forbidden_traits=base.forbidden_traits | frozenset(flavor.forbidden_traits),
        member_of=base.member_of + member_of,
        forbidden_aggregates=base.forbidden_aggregates | forbidden_aggregates,
        one_numa_node=one_numa_node(flavor.extra_specs),
    )
