"""One transaction per call on SQLite (issue 27): a placement's reads, its decision and its
claim share one write transaction; a race met inside it rolls the whole back, and the call
is decided again with its reads and claims apart; a batch over a claim chunk still commits
chunk by chunk."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster.errors import ConcurrentUpdate, StoreUnavailable
from loadmaster.pending import Claim
from loadmaster.scheduler import RequestSpec, Scheduler
from loadmaster.service import Loadmaster
from loadmaster.store import history


@contextmanager
def _begins(lm: Loadmaster) -> Iterator[list[str]]:
    """The BEGIN statements the store's connections run meanwhile."""
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("BEGIN"):
            seen.append(statement)

    event.listen(lm.store.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(lm.store.engine, "before_cursor_execute", note)


def _pending(lm: Loadmaster, vm: str) -> dict[str, int]:
    return {r.resource_class: r.amount for r in lm.allocations.allocations(vm=vm)}


def test_a_placement_reads_decides_and_claims_in_one_transaction(slm: Loadmaster) -> None:
    add_hosts(slm, 3)
    small_flavor(slm)
    (vm,) = add_vms(slm, 1)
    slm.scheduler.refresh()
    with _begins(slm) as begins:
        result = slm.scheduler.schedule([RequestSpec(vms=[vm])])
    (placement,) = result.placements
    assert placement.error is None
    assert begins == ["BEGIN IMMEDIATE"]
    record = slm.vms.get(vm)
    assert (record.state, record.host) == ("pending", placement.host)
    assert _pending(slm, vm) == {"VCPU": 2, "MEMORY_MB": 4096}


def test_a_batch_over_a_claim_chunk_commits_chunk_by_chunk(slm: Loadmaster) -> None:
    add_hosts(slm, 3)
    small_flavor(slm)
    vms = add_vms(slm, 5)
    scheduler = Scheduler(slm.store, claim_chunk=2)
    scheduler.refresh()
    with _begins(slm) as begins:
        result = scheduler.schedule([RequestSpec(vms=vms)])
    assert [p.error for p in result.placements] == [None] * 5
    # One read, then three claims of 2, 2 and 1 VMs, each committed on its own.
    assert begins == ["BEGIN DEFERRED"] + ["BEGIN IMMEDIATE"] * 3


def test_a_race_in_the_one_transaction_rolls_it_back_and_decides_again(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    vms = add_vms(slm, 2)
    ledger = slm.scheduler._ledger
    real = ledger.claim_many
    shared: list[int] = []

    def written_then_lost(claims: Sequence[Claim], **kwargs: Any) -> Any:
        if kwargs.get("transaction") is None:
            return real(claims, **kwargs)
        shared.append(len(claims))
        real(claims, **kwargs)  # its records are written in the call's transaction...
        raise ConcurrentUpdate("lost meanwhile", field="host")  # ...which must drop them

    monkeypatch.setattr(ledger, "claim_many", written_then_lost)
    result = slm.scheduler.schedule([RequestSpec(vms=vms)])
    assert shared == [2]
    assert [p.error for p in result.placements] == [None, None]
    for vm, placement in zip(vms, result.placements, strict=True):
        assert slm.vms.get(vm).host == placement.host
        assert _pending(slm, vm) == {"VCPU": 2, "MEMORY_MB": 4096}  # claimed once
    # The scheduler's kept view holds what the ledger holds, not the rolled-back claims.
    fresh = Scheduler(slm.store)
    fresh.refresh()
    kept = slm.scheduler._source.refresh()
    assert np.array_equal(kept.used, fresh._source.snapshot.used)
    assert kept.used.sum() == 2 * (2 + 4096)


def test_a_refused_claim_in_the_one_transaction_is_answered_as_before(
    slm: Loadmaster,
) -> None:
    add_hosts(slm, 1)
    small_flavor(slm)
    (vm,) = add_vms(slm, 1)
    slm.scheduler.schedule([RequestSpec(vms=[vm])])
    # Pending already: a second start is refused by the ledger, nothing decided again.
    result = slm.scheduler.schedule([RequestSpec(vms=[vm])], intent="start")
    (placement,) = result.placements
    assert placement.error is not None
    assert _pending(slm, vm) == {"VCPU": 2, "MEMORY_MB": 4096}


def test_a_failed_commit_leaves_nothing_in_the_kept_view(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    vms = add_vms(slm, 2)
    slm.scheduler.refresh()

    def disk_gone(transaction: object) -> None:  # the last step before COMMIT
        raise StoreUnavailable("database unavailable; nothing was written")

    monkeypatch.setattr(history, "write_events", disk_gone)
    with pytest.raises(StoreUnavailable):
        slm.scheduler.schedule([RequestSpec(vms=vms)])
    monkeypatch.undo()
    assert [slm.vms.get(vm).host for vm in vms] == [None, None]
    # The claims were never applied to the scheduler's view: the next call sees free hosts.
    assert slm.scheduler._source.refresh().used.sum() == 0
    result = slm.scheduler.schedule([RequestSpec(vms=vms)])
    assert [p.error for p in result.placements] == [None, None]
