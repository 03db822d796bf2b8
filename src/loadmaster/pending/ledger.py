"""The allocation ledger: pending and active records, claimed, activated and released.

One record per (VM, provider, class). Totals are never stored: every capacity check sums
the records inside the claiming transaction, and every change bumps the host's
generation with a compare-and-swap, so two processes claiming on one host can never
both win (the loser re-reads and retries, or is told why not).

``Ledger`` is the ledger's front: each method is one transaction (``store.write()`` or
``store.read()``) around the functions that do the work: ``claims`` (writing claims),
``lifecycle`` (activation, release, stop, delete, failures), ``reconcile`` (a host's
report) and ``usage`` (reads). Locks and generations are ``store.locking``'s.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Iterable, Sequence, Set
from datetime import datetime

from loadmaster.cluster.records import AllocationRecord, ClassUsage, VmRecord
from loadmaster.errors import ConcurrentUpdate, ValidationError
from loadmaster.pending import candidates, consumers, lifecycle, reconcile, reshape, usage
from loadmaster.pending import claims as claims_module
from loadmaster.pending.claims import CLAIM_INTENTS, Claim, ClaimOutcome
from loadmaster.pending.consumers import ConsumerWrite
from loadmaster.pending.lifecycle import FailOutcome
from loadmaster.pending.reconcile import ReconcileResult
from loadmaster.store import Store
from loadmaster.store.transaction import Transaction

DEFAULT_CONFLICT_RETRIES = 10

log = logging.getLogger(__name__)


class Ledger:
    def __init__(
        self,
        store: Store,
        *,
        conflict_retries: int = DEFAULT_CONFLICT_RETRIES,
        randomize_candidates: bool = False,
    ) -> None:
        self._store = store
        self._retries = conflict_retries
        self._randomize = randomize_candidates

    # -- claiming ----------------------------------------------------------------------
    def claim(
        self,
        vm: str,
        host: str,
        *,
        expected_generation: int | None = None,
        intent: str | None = None,
    ) -> list[AllocationRecord]:
        outcome = self.claim_many([Claim(vm, host, expected_generation, intent=intent)])[0]
        return list(outcome.allocations)

    def claim_many(
        self,
        claims: Sequence[Claim],
        *,
        all_or_nothing: bool = True,
        transaction: Transaction | None = None,
    ) -> list[ClaimOutcome]:
        """Claim many VMs in one transaction, each seeing the claims before it.

        ``all_or_nothing``: the first failure raises and nothing is written (a gang).
        Otherwise every claim gets its own outcome and the good ones land together.
        ``transaction``: a write transaction the caller holds (``Store.transaction()``),
        claimed in as it is, never retried: a failure raises and the caller must roll the
        whole transaction back, since a claim may have written before it failed.
        """
        if not claims:
            return []
        for i, c in enumerate(claims):
            if c.intent not in CLAIM_INTENTS:
                raise ValidationError(
                    f"claims[{i}].intent must be start, migrate or evacuate, got {c.intent!r}",
                    field=f"claims[{i}].intent",
                )
        if transaction is not None:
            return claims_module.claim(transaction, claims, all_or_nothing)
        # A claim pinned to the generation its caller read cannot succeed on a re-read: the
        # host has moved on. Retrying is worth it only if some claim could still land.
        pinned = [c.expected_generation is not None for c in claims]
        futile = any(pinned) if all_or_nothing else all(pinned)
        retries = 0 if futile else self._retries
        for attempt in range(retries + 1):
            try:
                with self._store.transaction() as transaction:
                    return claims_module.claim(transaction, claims, all_or_nothing)
            except ConcurrentUpdate:
                if attempt == retries:
                    raise
        raise AssertionError("unreachable")

    # -- lifecycle ---------------------------------------------------------------------
    def activate(self, vm: str, host: str | None = None) -> VmRecord:
        with self._store.write() as session:
            return lifecycle.activate(session, vm, host)

    def release(self, vm: str, host: str | None = None) -> int:
        with self._store.write() as session:
            return lifecycle.release(session, vm, host)

    def stop(self, vm: str, *, if_on: str | None = None) -> VmRecord:
        with self._store.write() as session:
            return lifecycle.stop(session, vm, if_on=if_on)

    def delete(self, vm: str) -> VmRecord:
        with self._store.write() as session:
            return lifecycle.delete(session, vm)

    def fail(self, vm: str, host: str, reason: str) -> FailOutcome:
        with self._store.write() as session:
            return lifecycle.fail(session, vm, host, reason)

    def reconcile(
        self,
        host: str,
        present: Iterable[str],
        *,
        as_of: datetime | None = None,
        seen_generation: int | None = None,
        launching: Iterable[str] = (),
    ) -> ReconcileResult:
        """See ``reconcile.reconcile``. Judged first in a read transaction: a report that
        changes nothing (a host starting with nothing to say, a repeated list) takes no
        write transaction, which SQLite would serialise with every claim."""
        present, launching = list(present), list(launching)
        judge = functools.partial(
            reconcile.reconcile,
            host=host,
            present=present,
            as_of=as_of,
            seen_generation=seen_generation,
            launching=launching,
        )
        with self._store.read() as session:
            judged = judge(session, dry_run=True)
        if not (judged.activated or judged.released or judged.stopped):
            return judged
        with self._store.write() as session:
            result = judge(session)
        for vm, reason in result.reasons:
            log.warning("VM %s ended by its host's report: %s", vm, reason)
        return result

    # -- reading -----------------------------------------------------------------------
    def allocations(
        self, *, vm: str | None = None, host: str | None = None, state: str | None = None
    ) -> list[AllocationRecord]:
        with self._store.read() as session:
            return usage.allocations(session, vm=vm, host=host, state=state)

    def usages(self, hosts: Iterable[str] | None = None) -> dict[str, dict[str, ClassUsage]]:
        with self._store.read() as session:
            return usage.usages(session, hosts)

    def pending_for_host(self, host: str) -> dict[str, int]:
        with self._store.read() as session:
            return usage.pending_for_host(session, host)

    def pending_for_vm(self, vm: str) -> dict[str, dict[str, int]]:
        with self._store.read() as session:
            return usage.pending_for_vm(session, vm)

    # -- Placement's consumers ------------------------------------------------------------
    def write_consumers(self, writes: Sequence[ConsumerWrite]) -> None:
        """Placement's ``PUT``/``POST /allocations``: every consumer or none."""
        with self._store.write() as session:
            consumers.write(session, writes)

    def reshape(
        self,
        inventories: Sequence[reshape.ProviderInventories],
        writes: Sequence[ConsumerWrite],
    ) -> None:
        """Placement's reshaper: inventories and allocations replaced together."""
        with self._store.write() as session:
            reshape.reshape(session, inventories, writes)

    def candidates(
        self,
        groups: Sequence[candidates.RequestGroup],
        *,
        isolate: bool = False,
        root_ok: Callable[[Set[str]], bool] | None = None,
        same_subtree: Sequence[Sequence[str]] = (),
        limit: int | None = None,
        nested_aware: bool = True,
    ) -> candidates.Candidates:
        """Placement's allocation candidates for these request groups, read in one
        transaction (see ``pending/candidates.py``); shuffled when the ledger was made
        with ``randomize_candidates``."""
        with self._store.read() as session:
            return candidates.find(
                session,
                groups,
                isolate=isolate,
                root_ok=root_ok or (lambda _: True),
                same_subtree=same_subtree,
                limit=limit,
                nested_aware=nested_aware,
                rng=random.Random() if self._randomize else None,
            )

    def consumer(self, uuid: str) -> usage.ConsumerView | None:
        with self._store.read() as session:
            return usage.consumer(session, uuid)

    def provider_allocations(self, provider: str) -> tuple[int, dict[str, usage.Holding]]:
        with self._store.read() as session:
            return usage.provider_allocations(session, provider)

    def consumer_usages(
        self, project_id: str, user_id: str | None = None, consumer_type: str | None = None
    ) -> dict[str, dict[str, int]]:
        with self._store.read() as session:
            return usage.consumer_usages(session, project_id, user_id, consumer_type)

    def project_usage(self, project_id: str) -> dict[str, dict[str, int]]:
        with self._store.read() as session:
            return usage.project_usage(session, project_id)
