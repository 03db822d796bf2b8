"""The scheduler's public calls (``schedule``, ``start``, ``migrate``, ``explain``,
``capacity``): many VMs per call, several schedulers at once.

A call is resolved (``resolve.py`` reads what the requests name, ``source.py`` brings the
snapshot up to date), then run in rounds (``rounds.py``): the pure core (``core/``)
proposes a host per VM, a committer (``commit.py``) claims them through the ledger, and a
VM whose claim lost a race is decided again on a fresher snapshot. Best-effort calls that
arrive while another is deciding are decided together with it (``coalesce.py``). Calls
that claim go to the scheduling process when there is one (``hand_claims_to``,
``remote.py``). Nothing is kept between calls but the snapshot, which a refresh brings up
to date and our own landed claims update directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from loadmaster.cluster import lookup
from loadmaster.cluster.liveness import DEFAULT_SILENT_AFTER_S
from loadmaster.errors import LoadmasterError, ValidationError
from loadmaster.pending import Ledger
from loadmaster.pending.ledger import CLAIM_INTENTS
from loadmaster.scheduler.coalesce import Ticket, Waiting, intent_kind, merge
from loadmaster.scheduler.commit import LedgerCommitter, RolledBack
from loadmaster.scheduler.core import questions
from loadmaster.scheduler.core.decide import order_for_groups
from loadmaster.scheduler.core.policies import Policy
from loadmaster.scheduler.core.request import MAX_VMS_PER_CALL, RequestSpec
from loadmaster.scheduler.core.results import (
    CapacityReport,
    Explanation,
    NoHostFits,
    ScheduleResult,
)
from loadmaster.scheduler.registry import PolicyRegistry
from loadmaster.scheduler.remote import NotReached, SchedulingClient
from loadmaster.scheduler.reports import record_report
from loadmaster.scheduler.resolve import Resolved, check_size, resolve, vm_count
from loadmaster.scheduler.rounds import Call, Rounds
from loadmaster.scheduler.source import SnapshotSource
from loadmaster.store import Store
from loadmaster.store.transaction import Transaction

MAX_SEED = 2**63 - 1


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
        agent_silent_after: float = DEFAULT_SILENT_AFTER_S,
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
        self._source = SnapshotSource(store)
        self.agent_silent_after = agent_silent_after
        self._policies = PolicyRegistry(
            policies, default_policy, subset_size=subset_size, tie_tolerance=tie_tolerance
        )
        self._claim_chunk = claim_chunk
        self._rounds = Rounds(
            store, self._source, claim_chunk=claim_chunk, max_attempts=max_attempts
        )
        # Seeds of calls that bring none; each call then decides with its own seed.
        self._seeds = np.random.default_rng(seed)
        # One decision at a time per Scheduler object: the arrays are not thread-safe.
        self._lock = threading.RLock()
        # Calls waiting for the lock; whichever holds it decides them together (coalesce.py).
        self._waiting = Waiting()
        self._delegate: SchedulingClient | None = None

    @property
    def agent_silent_after(self) -> float:
        """Seconds without a word from a host's agent before the live-agent filter rules
        the host out (``agent_silent_after``; the twin answering reads follows)."""
        return self._source.agent_silent_after

    @agent_silent_after.setter
    def agent_silent_after(self, seconds: float) -> None:
        self._source.agent_silent_after = seconds
        if self._reader is not None:
            self._reader.agent_silent_after = seconds

    @property
    def policies(self) -> Mapping[str, Policy]:
        """The policies calls may name, the built-in ones and the operator's."""
        return self._policies.policies

    @property
    def default_policy(self) -> str:
        """The policy of calls that name none."""
        return self._policies.default

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
        unless every VM has a host). ``dry_run``: decide the same way, claim nothing; each
        placement then carries the chosen host's score per weigher, and the runners-up's.
        ``move_pending``: a VM pending on a host (claimed, not started) is re-placed
        elsewhere in the claim's transaction (a drain) instead of being refused.
        ``intent`` ("start" or "migrate", see ``Claim``) refuses VMs in the other state,
        here and again in the ledger under the VM's row lock. ``seed`` (0 to 2**63 - 1)
        replays a decision: the result's ``seed`` given again on the same state chooses
        the same hosts. Failures come back per VM in the result; bad requests raise.

        Best-effort real calls without a seed that arrive while another call is deciding
        are decided together with it (``coalesce.py``); each still gets its own result, and
        its seed replays the batch it was decided in."""
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED
        ):
            raise ValidationError(
                f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}", field="seed"
            )
        if self._delegate is not None and not dry_run:
            try:
                return self._delegate.schedule(
                    requests,
                    gang=gang,
                    policy=policy,
                    move_pending=move_pending,
                    intent=intent,
                    seed=seed,
                )
            except NotReached:
                pass  # decided here, as a lone worker decides
        if dry_run and not self._reads_only:
            return self._for_reads().schedule(
                requests, gang=gang, dry_run=True, policy=policy, intent=intent, seed=seed
            )
        if not dry_run and self._reads_only:
            raise ValidationError("this scheduler only answers dry runs", field="dry_run")
        started = time.perf_counter()
        chosen = self._policies.named(policy or self.default_policy, "policy")
        if intent not in CLAIM_INTENTS:
            raise ValidationError(
                f"intent must be start, migrate or evacuate, got {intent!r}", field="intent"
            )
        check_size(requests, self._max_vms)
        if not (gang or dry_run or move_pending or seed is not None):
            return self._together(requests, chosen, intent, started)
        with self._lock:
            if seed is None:
                seed = int(self._seeds.integers(MAX_SEED, endpoint=True))
            committer = (
                None
                if dry_run
                else LedgerCommitter(self._ledger, self._source, move_pending=move_pending)
            )
            call = Call(self._begin(requests, dry_run, move_pending, intent), seed, committer)
            loaded = self._policies.loaded(chosen)
            run = self._rounds.gang if gang else self._rounds.best_effort
            placements, conflicts = run(call, loaded)
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

    def start(
        self, vm: str, *, host: str | None = None, policy: str | None = None
    ) -> ScheduleResult:
        """Place ``vm`` and claim there (intent ``start``); a failure is the placement's
        ``error``, as ``schedule`` answers. ``host`` pins it (the operator's
        choice; admin only through the API): every filter still judges that host, and one
        that does not fit is refused with each filter's reason. A host that does not
        exist, or a child provider, is refused before anything is decided."""
        return self._one(vm, host, policy, "start")

    def migrate(
        self, vm: str, *, host: str | None = None, policy: str | None = None
    ) -> ScheduleResult:
        """Claim a destination for running ``vm`` (intent ``migrate``), pinned to ``host``
        as ``start`` pins it: a named destination is judged by every filter too, as Nova
        schedules a live migration to a named host, so a host without a live agent, or
        one the VM's group rules forbid, is refused in its own terms."""
        return self._one(vm, host, policy, "migrate")

    def _one(self, vm: str, host: str | None, policy: str | None, intent: str) -> ScheduleResult:
        if host is not None:
            with self._store.read() as session:
                lookup.root_host_row(session, host, "name its root host")
        spec = RequestSpec(vms=[vm], include_hosts=[host] if host is not None else None)
        result = self.schedule([spec], policy=policy, intent=intent)
        (placement,) = result.placements
        if not isinstance(placement.error, NoHostFits):
            return result
        # Refused: said again with the VM's name, as its operator knows it.
        with self._store.read() as session:
            uuid = lookup.vm_uuid(vm)
            name = lookup.vm_names(session, [uuid]).get(uuid)
        refused = NoHostFits(placement.error.explanation, pinned=host, intent=intent, name=name)
        return replace(result, placements=(replace(placement, error=refused),))

    def explain(
        self, request: RequestSpec, *, policy: str | None = None, seed: int | None = None
    ) -> Explanation:
        """Why hosts are ruled out for the request, right now. The request is decided as
        a dry run with ``policy`` and ``seed`` decides it, so the answer agrees with that
        run: the first VM that would fit nowhere, explained as its failure is (a group
        too big for any host, a group rule that leaves no host); when every VM fits, the
        first one, with how many hosts fit it and the best ones' scores per weigher."""
        if not self._reads_only:
            return self._for_reads().explain(request, policy=policy, seed=seed)
        result = self.schedule([request], dry_run=True, policy=policy, seed=seed)
        for placement in result.placements:
            if placement.explanation is not None:
                return placement.explanation
            if placement.error is not None:
                raise placement.error
        loaded = self._policies.loaded(
            self._policies.named(policy or self.default_policy, "policy")
        )
        with self._lock:
            resolved = self._begin([request], dry_run=True)
            items = [(item.position, item.request) for item in resolved.items]
            first = order_for_groups(items)[0][1]
            return questions.explain(self._source.snapshot, first, loaded)

    def capacity(
        self, flavor: str, *, group: str | None = None, policy: str | None = None, **spec: Any
    ) -> CapacityReport:
        """How many more VMs of ``flavor`` fit now, and on which hosts (best first by
        ``policy``). Extra keywords are ``RequestSpec`` fields (traits, member_of, ...).
        With a hard-affinity group all of them must share one host, so ``total`` is the
        most any single host takes."""
        if not self._reads_only:
            return self._for_reads().capacity(flavor, group=group, policy=policy, **spec)
        loaded = self._policies.loaded(
            self._policies.named(policy or self.default_policy, "policy")
        )
        with self._lock:
            resolved = self._begin([RequestSpec(flavor=flavor, group=group, **spec)], True)
            request = resolved.items[0].request
            return questions.capacity(self._source.snapshot, request, loaded, flavor, group)

    def hand_claims_to(self, delegate: SchedulingClient | None) -> None:
        """Placements that claim go to the scheduling process ``delegate`` reaches
        (``remote.py``); this scheduler still answers the read-only questions, and decides
        the calls the process cannot be asked. ``None``: decide everything here."""
        self._delegate = delegate

    def refresh(self) -> None:
        """Bring the in-memory host state up to date now (every call does it anyway; a
        server calls this at start so the first request does not pay the full load)."""
        with self._lock:
            self._source.refresh()

    def agents_changed(self) -> None:
        """This process wrote which run of a host's manager holds its list (or has just
        started): the next placement reads the agents again, not up to a second later."""
        for scheduler in (self, self._reader):
            if scheduler is not None:
                scheduler._source.agents_changed()

    def record_report(
        self,
        host: str,
        usage: Mapping[str, float],
        load: Mapping[str, float],
        running_vms: Sequence[str] | None,
    ) -> None:
        """Store a host agent's latest measurements (see ``reports.record_report``)."""
        record_report(self._store, host, usage, load, running_vms)
        for scheduler in (self, self._reader):
            if scheduler is not None:
                scheduler._source.reported()

    # -- calls decided together ---------------------------------------------------------
    def _together(
        self, requests: Sequence[RequestSpec], policy: Policy, intent: str | None, started: float
    ) -> ScheduleResult:
        ticket = Ticket(requests, (policy.name, intent_kind(intent)), started, intent)
        self._waiting.add(ticket)
        with self._lock:
            if not ticket.served:
                batch = self._waiting.take(ticket, self._max_vms)
                try:
                    self._decide_together(batch, policy)
                except BaseException as exc:
                    for waiting in batch:
                        if not waiting.served:
                            waiting.error = exc
        return ticket.outcome()

    def _decide_together(self, batch: list[Ticket], policy: Policy) -> None:
        seed = int(self._seeds.integers(MAX_SEED, endpoint=True))
        loaded = self._policies.loaded(policy)
        calls, intents = [t.requests for t in batch], [t.intent for t in batch]
        try:
            with self._one_transaction(calls) as transaction:
                resolved, spans = self._begin_many(calls, False, False, intents, transaction)
                committer = LedgerCommitter(self._ledger, self._source, transaction=transaction)
                placements, _ = self._rounds.best_effort(Call(resolved, seed, committer), loaded)
            if committer.landing is not None:
                self._source.landed(*committer.landing)
        except RolledBack:
            # Rolled back whole, nothing applied to the snapshot: decided again with the
            # reads and the claims apart, where a lost race is decided again as usual.
            resolved, spans = self._begin_many(calls, False, False, intents)
            committer = LedgerCommitter(self._ledger, self._source)
            placements, _ = self._rounds.best_effort(Call(resolved, seed, committer), loaded)
        placements.sort(key=lambda pair: pair[0])
        for ticket, span in zip(batch, spans, strict=True):
            if isinstance(span, LoadmasterError):
                ticket.error = span
                continue
            mine = [p for position, p in placements if position in span]
            ticket.result = ScheduleResult(
                tuple(mine),
                gang=False,
                dry_run=False,
                policy=policy.name,
                # Each claim lost to another scheduler made its VM be decided once more.
                conflicts=sum(max(p.attempts - 1, 0) for p in mine),
                seconds=time.perf_counter() - ticket.started,
                seed=seed,
            )

    # -- setting up a call ---------------------------------------------------------------
    def _for_reads(self) -> Scheduler:
        """The twin that answers read-only questions (made on first use)."""
        with self._reader_lock:
            if self._reader is None:
                reader = Scheduler(
                    self._store, agent_silent_after=self.agent_silent_after, **self._settings
                )
                reader._policies.follow(self._policies)
                reader._reads_only = True
                self._reader = reader
            return self._reader

    def use_policies(self, policies: Mapping[str, Policy]) -> None:
        """Replace the operator's policies (the built-in ones stay), as a reload does:
        each is checked as a call would check it, and the default must remain, else
        nothing changes. Calls under way finish with the policy they started with."""
        self._policies.replace(policies)
        with self._reader_lock:
            if self._reader is not None:
                self._reader.use_policies(policies)

    def _begin(
        self,
        requests: Sequence[RequestSpec],
        dry_run: bool,
        move_pending: bool = False,
        intent: str | None = None,
    ) -> Resolved:
        resolved, (span,) = self._begin_many([requests], dry_run, move_pending, [intent])
        if isinstance(span, LoadmasterError):
            raise span
        return resolved

    @contextmanager
    def _one_transaction(
        self, calls: Sequence[Sequence[RequestSpec]]
    ) -> Iterator[Transaction | None]:
        """On SQLite, calls that fit one claim chunk read, decide and claim in one write
        transaction: one begin and commit fewer, and since SQLite has one writer at a time
        and this holds it, what was read is still true when the claim checks it. A larger
        batch commits chunk by chunk, so that its first VMs land, and other writers get
        their turn, while the rest are decided. On PostgreSQL the reads stay one read-only
        REPEATABLE READ snapshot and the claims a READ COMMITTED transaction of their own
        (``store/locking.py``): a write transaction at REPEATABLE READ would fail on every
        row another scheduler changed since it began. None: no shared transaction."""
        vms = sum(
            vm_count(spec) for call in calls for spec in call if isinstance(spec, RequestSpec)
        )
        if not self._store.is_sqlite or vms > self._claim_chunk:
            yield None
            return
        with self._store.transaction() as transaction:
            yield transaction

    def _begin_many(
        self,
        calls: Sequence[Sequence[RequestSpec]],
        dry_run: bool,
        move_pending: bool,
        intents: Sequence[str | None],
        transaction: Transaction | None = None,
    ) -> tuple[Resolved, list[range | LoadmasterError]]:
        """The calls resolved as one batch (see ``coalesce.merge``), each with its intent,
        a refused call carrying its error. One read transaction for all (``transaction``
        if given): the snapshot's refresh, the requests and their groups' members."""
        with self._store.read_transaction(transaction) as session:
            snap = self._source.refresh(session)
            each: list[Resolved | LoadmasterError] = []
            for requests, intent in zip(calls, intents, strict=True):
                try:
                    each.append(
                        resolve(
                            self._store,
                            snap,
                            requests,
                            dry_run=dry_run,
                            move_pending=move_pending,
                            intent=intent,
                            session=session,
                        )
                    )
                except LoadmasterError as exc:
                    each.append(exc)
            resolved, spans = merge(each)
            self._source.load_groups(resolved.groups.values(), resolved.leaving, session)
        return resolved, spans
