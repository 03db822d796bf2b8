"""Committing what the core proposed: the claim half of a schedule call.

The core (``core/decide.py``) proposes a host per VM from a snapshot; a ``Committer``
makes the proposals stick or says why not, as Nomad's scheduler hands its plan to a
``Planner`` that applies it. Proposals carry no generation pin: the ledger checks capacity
and group rules again under the hosts' and groups' locks, so a proposal made on a stale
snapshot can only cost a refusal, which ``rounds.py`` decides again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from loadmaster.errors import (
    ConcurrentUpdate,
    Conflict,
    InvalidTransition,
    LoadmasterError,
    NotFound,
)
from loadmaster.pending import Claim, ClaimOutcome, Ledger
from loadmaster.scheduler.core.decide import Decision
from loadmaster.scheduler.resolve import Item
from loadmaster.scheduler.source import Landed, SnapshotSource
from loadmaster.store.transaction import Transaction

# A VM the core placed: the resolved item and the host the core chose for it.
Proposal = tuple[Item, Decision]


class Committer(Protocol):
    def commit(
        self, proposals: Sequence[Proposal], *, all_or_nothing: bool
    ) -> list[LoadmasterError | None]:
        """Claim each proposal's host: per proposal, None (it landed) or why not.
        ``all_or_nothing``: every one lands, or the first refusal raises and none does."""
        ...


class RolledBack(Exception):
    """A claim in a call's one transaction met a race (with a writer SQLite let in, or
    a check the snapshot and the ledger judge apart): the transaction is rolled back."""


class LedgerCommitter:
    """Claims through this process's ledger and applies what landed to the snapshot.

    ``transaction``: the write transaction the call holds from its reads to its claims
    (``Scheduler._one_transaction``); a lost race in it raises ``RolledBack``, and what
    landed waits in ``landing`` until the caller has committed. ``move_pending``: a VM
    pending on a host is re-placed elsewhere (a drain)."""

    def __init__(
        self,
        ledger: Ledger,
        source: SnapshotSource,
        *,
        move_pending: bool = False,
        transaction: Transaction | None = None,
    ) -> None:
        self._ledger, self._source = ledger, source
        self._move_pending, self._transaction = move_pending, transaction
        self.landing: tuple[list[Landed], int | None] | None = None

    def commit(
        self, proposals: Sequence[Proposal], *, all_or_nothing: bool
    ) -> list[LoadmasterError | None]:
        claims = [self._claim(item, decision) for item, decision in proposals]
        if all_or_nothing:
            self._ledger.claim_many(claims, all_or_nothing=True)
            self._source.landed([landed(d) for _, d in proposals], clock=None)
            return [None] * len(proposals)
        try:
            outcomes = self._ledger.claim_many(
                claims, all_or_nothing=False, transaction=self._transaction
            )
        except ConcurrentUpdate as exc:
            if self._transaction is not None:
                raise RolledBack from exc
            outcomes = [ClaimOutcome(c.vm, c.host, error=exc) for c in claims]
        if self._transaction is not None and any(
            o.error is not None and lost_race(o.error) for o in outcomes
        ):
            # The claim may have written some: the caller rolls back and starts over.
            raise RolledBack
        landings = [
            landed(decision)
            for (_, decision), outcome in zip(proposals, outcomes, strict=True)
            if outcome.error is None
        ]
        clocks = {o.clock for o in outcomes if o.error is None}
        # A drain's re-placed VMs also left hosts the snapshot did not update: read all.
        clock = clocks.pop() if len(clocks) == 1 and not self._move_pending else None
        if self._transaction is None:
            self._source.landed(landings, clock)
        else:
            self.landing = (landings, clock)  # once committed
        return [outcome.error for outcome in outcomes]

    def _claim(self, item: Item, decision: Decision) -> Claim:
        # Not pinned to the generations the decision saw: the ledger checks capacity and
        # group rules again under the hosts' and groups' locks, so a stale view can only
        # cost a refusal (decided again), never an overcommit. Pinning made every agent's
        # "up" (which changes no usage but moves the generation) fail whole batches of a
        # mass start on PostgreSQL, as Placement's provider generations do for Nova.
        assert decision.host is not None
        return Claim(
            decision.request.vm or "",
            self._source.snapshot.names[decision.host],
            move=self._move_pending,
            intent=item.intent,
        )


def landed(decision: Decision) -> Landed:
    assert decision.host is not None
    request = decision.request
    group = request.group.name if request.group is not None else None
    return (
        decision.host,
        request.resources,
        group,
        request.one_numa_node,
        request.pci_numa_affinity,
        request.class_traits,
        request.shared_held,
    )


def lost_race(error: LoadmasterError) -> bool:
    """Errors a fresher view of the hosts can cure: a changed generation, a host that
    filled up, left service or was deleted meanwhile. A VM in the wrong state cannot be
    cured so."""
    if isinstance(error, NotFound):
        return (error.field or "").endswith("host")
    return isinstance(error, Conflict) and not isinstance(error, InvalidTransition)
