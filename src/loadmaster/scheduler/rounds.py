"""A call's rounds: the core decides, the committer claims, and a VM whose claim lost a
race to another scheduler is decided again on a fresher snapshot (a bounded number of
times). A gang is all or nothing; best effort claims chunk by chunk."""

from __future__ import annotations

from loadmaster.errors import ConcurrentUpdate, Conflict, LoadmasterError
from loadmaster.scheduler.commit import Committer, Proposal, lost_race
from loadmaster.scheduler.core.decide import Decision, LoadedPolicy, decide
from loadmaster.scheduler.core.results import Placement
from loadmaster.scheduler.resolve import Item, Resolved
from loadmaster.scheduler.source import SnapshotSource
from loadmaster.store import Store

# A placement with the position of its VM among the call's.
Positioned = tuple[int, Placement]


class Call:
    """One ``schedule`` call: what it resolved, its seed, how many rounds it decided, and
    what claims its proposals (None: a dry run, which claims nothing)."""

    def __init__(self, resolved: Resolved, seed: int, committer: Committer | None) -> None:
        self.resolved, self.seed, self.committer = resolved, seed, committer
        self.round = 0


class Rounds:
    """Runs calls' rounds over ``source``'s snapshot: ``claim_chunk`` proposals are
    committed at a time in best effort, and one VM is decided at most ``max_attempts``
    times."""

    def __init__(
        self, store: Store, source: SnapshotSource, *, claim_chunk: int, max_attempts: int
    ) -> None:
        self._store, self._source = store, source
        self.claim_chunk, self._max_attempts = claim_chunk, max_attempts

    def gang(self, call: Call, policy: LoadedPolicy) -> tuple[list[Positioned], int]:
        items = call.resolved.items
        for item in items:
            if item.error is not None:
                return self._abort(items, item, item.error), 0
        conflicts = 0
        for _ in range(self._max_attempts):
            decided = self._decide(call, items, policy, gang=True)
            for item, decision in decided:
                if decision.error is not None:
                    return self._abort(items, item, decision.error), conflicts
            if call.committer is None:
                return [self._placed(item, d) for item, d in decided], conflicts
            try:
                call.committer.commit(decided, all_or_nothing=True)
            except LoadmasterError as exc:
                if not lost_race(exc):
                    return self._abort(items, None, exc), conflicts
                # Another scheduler changed a chosen host: decide again on the store's view.
                conflicts += 1
                self._reload(call)
                continue
            return [self._placed(item, d) for item, d in decided], conflicts
        gave_up = ConcurrentUpdate(
            f"gang of {len(items)} VMs lost the race for its hosts {self._max_attempts} times "
            "to other schedulers; nothing was claimed, try again",
            field="requests",
        )
        return self._abort(items, None, gave_up), conflicts

    def best_effort(self, call: Call, policy: LoadedPolicy) -> tuple[list[Positioned], int]:
        items = call.resolved.items
        out = [self._failed(item) for item in items if item.error is not None]
        queue = [item for item in items if item.error is None]
        conflicts = 0
        while queue:
            chosen = []
            for item, decision in self._decide(call, queue, policy, gang=False):
                if decision.error is not None:
                    item.error = decision.error
                    out.append(self._failed(item))
                elif call.committer is None:
                    out.append(self._placed(item, decision))
                else:
                    chosen.append((item, decision))
            retry: list[Item] = []
            for start in range(0, len(chosen), self.claim_chunk):
                chunk = chosen[start : start + self.claim_chunk]
                retry += self._commit(call, chunk, out)
            if retry:
                conflicts += len(retry)
                self._reload(call)
            queue = retry
        return out, conflicts

    def _commit(self, call: Call, chosen: list[Proposal], out: list[Positioned]) -> list[Item]:
        """Commit one chunk; record what landed, return the VMs to decide again."""
        assert call.committer is not None  # a dry run proposes nothing to commit
        errors = call.committer.commit(chosen, all_or_nothing=False)
        retry = []
        for (item, decision), error in zip(chosen, errors, strict=True):
            if error is None:
                out.append(self._placed(item, decision))
                continue
            if lost_race(error) and item.attempts < self._max_attempts:
                retry.append(item)
                continue
            item.error = error
            if lost_race(error):
                item.error = ConcurrentUpdate(
                    f"VM {item.request.label}: gave up after {item.attempts} claims lost to "
                    f"other schedulers; last: {error.detail}",
                    field="vm",
                )
            out.append(self._failed(item))
        return retry

    def _decide(
        self, call: Call, items: list[Item], policy: LoadedPolicy, gang: bool
    ) -> list[tuple[Item, Decision]]:
        decisions = decide(
            self._source.snapshot,
            [item.request for item in items],
            policy,
            call.seed,
            all_or_nothing=gang,
            breakdown=call.committer is None,
            attempt=call.round,
        )
        call.round += 1
        out = []
        for decision in decisions:
            item = items[decision.index]
            item.attempts += 1
            item.seconds += decision.seconds
            out.append((item, decision))
        return out

    def _reload(self, call: Call) -> None:
        with self._store.read_transaction() as session:
            self._source.refresh(session)
            self._source.load_groups(call.resolved.groups.values(), call.resolved.leaving, session)

    def _abort(
        self, items: list[Item], culprit: Item | None, cause: LoadmasterError
    ) -> list[Positioned]:
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

    def _failed(self, item: Item) -> Positioned:
        return item.position, Placement(
            item.request.label, None, item.error, item.seconds, item.attempts
        )

    def _placed(self, item: Item, decision: Decision) -> Positioned:
        assert decision.host is not None
        return item.position, Placement(
            item.request.label,
            self._source.snapshot.names[decision.host],
            None,
            item.seconds,
            item.attempts,
            decision.scores,
        )
