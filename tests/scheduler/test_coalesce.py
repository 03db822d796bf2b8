"""Calls that queue behind a deciding call are decided together (``coalesce.py``), and no
caller can tell from its own result: it holds exactly its own VMs, a refused call gets
its own error, and calls that cannot be merged (another policy, a seed, the same VM, a
migration with placements) are decided on their own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster.errors import NotFound, ValidationError
from loadmaster.pending import audit
from loadmaster.scheduler import RequestSpec, ScheduleResult
from loadmaster.service import Loadmaster


def _queued_behind_the_lock(
    lm: Loadmaster, calls: list[Callable[[], ScheduleResult]], tickets: int | None = None
) -> list[ScheduleResult | BaseException]:
    """Run ``calls`` in threads while this thread holds the scheduler's lock, release it
    once ``tickets`` of them (default: all) wait to be decided together, and return what
    each call returned or raised."""
    scheduler = lm.scheduler
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except BaseException as exc:  # handed to the test
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    with scheduler._lock:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while len(scheduler._waiting._tickets) < (tickets or len(calls)):
            assert time.monotonic() < deadline, "the calls never queued"
            time.sleep(0.01)
        # A call that cannot be merged waits on the lock without a ticket: let it get there.
        time.sleep(0.1)
    for thread in threads:
        thread.join(timeout=30)
    return out


def test_queued_calls_are_decided_as_one_batch_each_with_its_own_result(
    slm: Loadmaster,
) -> None:
    lm = slm
    add_hosts(lm, 4)
    small_flavor(lm)
    vms = add_vms(lm, 6)
    lm.scheduler.refresh()
    calls = (
        [
            lambda vm=vm: lm.scheduler.schedule([RequestSpec(vms=[vm])])  # type: ignore[misc]
            for vm in vms[:4]
        ]
        + [lambda: lm.scheduler.schedule([RequestSpec(vms=vms[4:6])])]
    )
    results = _queued_behind_the_lock(lm, calls)
    assert all(isinstance(r, ScheduleResult) for r in results), results
    for result, asked in zip(results, [[v] for v in vms[:4]] + [vms[4:6]], strict=True):
        assert isinstance(result, ScheduleResult)
        assert [p.vm for p in result.placements] == asked
        assert result.ok and result.conflicts == 0
    # One batch: one seed, and every VM holds its claim in the store.
    assert len({r.seed for r in results if isinstance(r, ScheduleResult)}) == 1
    placed = {v.uuid: v for v in lm.vms.list()}
    assert all(placed[v].state == "pending" and placed[v].host for v in vms)
    assert audit(lm.store) == []


def test_a_refused_call_gets_its_error_and_the_others_are_placed(slm: Loadmaster) -> None:
    lm = slm
    add_hosts(lm, 2)
    small_flavor(lm)
    vms = add_vms(lm, 2)
    lm.scheduler.refresh()
    missing = "00000000-0000-4000-8000-000000000000"
    results = _queued_behind_the_lock(
        lm,
        [
            lambda: lm.scheduler.schedule([RequestSpec(vms=[vms[0]])]),
            lambda: lm.scheduler.schedule([RequestSpec(vms=[missing])]),
            lambda: lm.scheduler.schedule([RequestSpec(vms=[vms[1]])]),
        ],
    )
    assert isinstance(results[1], NotFound)
    assert results[1].field == "requests[0].vms[0]"
    for result, vm in ((results[0], vms[0]), (results[2], vms[1])):
        assert isinstance(result, ScheduleResult) and result.placed.keys() == {vm}


def test_the_same_vm_asked_twice_at_once_is_placed_once(slm: Loadmaster) -> None:
    lm = slm
    add_hosts(lm, 2)
    small_flavor(lm)
    (vm,) = add_vms(lm, 1)
    lm.scheduler.refresh()
    results = _queued_behind_the_lock(
        lm, [lambda: lm.scheduler.schedule([RequestSpec(vms=[vm])]) for _ in range(3)]
    )
    outcomes = [r for r in results if isinstance(r, ScheduleResult)]
    assert len(outcomes) == 3
    placed = [r for r in outcomes if r.ok]
    assert len(placed) == 1
    # The others were decided after it (not merged with it): the VM already holds a claim.
    for refused in (r for r in outcomes if not r.ok):
        (placement,) = refused.placements
        assert placement.error is not None
        assert placement.error.code == "loadmaster.invalid_transition"
        assert "pending" in placement.error.detail
    assert len({r.seed for r in outcomes}) == 3
    assert audit(lm.store) == []


@pytest.mark.parametrize(
    "other",
    [
        {"policy": "pack"},  # another policy
        {"seed": 7},  # a replay
        {"gang": True},  # all or nothing
    ],
)
def test_calls_that_differ_are_decided_on_their_own(slm: Loadmaster, other: dict[str, Any]) -> None:
    lm = slm
    add_hosts(lm, 2)
    small_flavor(lm)
    vms = add_vms(lm, 3)
    lm.scheduler.refresh()
    results = _queued_behind_the_lock(
        lm,
        [
            lambda: lm.scheduler.schedule([RequestSpec(vms=[vms[0]])]),
            lambda: lm.scheduler.schedule([RequestSpec(vms=[vms[1]])], **other),
            lambda: lm.scheduler.schedule([RequestSpec(vms=[vms[2]])]),
        ],
        tickets=2 if "policy" not in other else 3,
    )
    assert all(isinstance(r, ScheduleResult) and r.ok for r in results), results
    seeds = [r.seed for r in results if isinstance(r, ScheduleResult)]
    # The two plain calls share a batch; the other one was decided by itself.
    assert seeds[0] == seeds[2] != seeds[1]


def test_starts_and_placements_go_together_each_vm_with_its_own_intent(
    slm: Loadmaster,
) -> None:
    """A start and a plain placement both place a VM that is not running, so they share a
    batch (an operator's tool starts VMs while other callers ``POST /schedule``); each VM
    is still resolved and claimed with its own call's intent: a start of a running VM is
    refused while a placement of one migrates it. A migration keeps to its own kind."""
    lm = slm
    add_hosts(lm, 4)
    small_flavor(lm)
    vms = add_vms(lm, 6)
    for vm in vms[2:5]:
        lm.scheduler.schedule([RequestSpec(vms=[vm])])
        lm.allocations.activate(vm)
    lm.scheduler.refresh()
    results = _queued_behind_the_lock(
        lm,
        [
            lambda: lm.scheduler.start(vms[0]),
            lambda: lm.scheduler.schedule([RequestSpec(vms=[vms[1]])]),
            lambda: lm.scheduler.start(vms[2]),  # running: a start is refused
            lambda: lm.scheduler.schedule([RequestSpec(vms=[vms[3]])]),  # running: migrates
            lambda: lm.scheduler.migrate(vms[4]),
            lambda: lm.scheduler.start(vms[5]),
        ],
    )
    assert all(isinstance(r, ScheduleResult) for r in results), results
    outcomes = [r for r in results if isinstance(r, ScheduleResult)]
    seeds = [r.seed for r in outcomes]
    assert len({seeds[i] for i in (0, 1, 2, 3, 5)}) == 1
    assert seeds[4] != seeds[0]
    (refused,) = outcomes[2].placements
    assert refused.error is not None and refused.error.code == "loadmaster.invalid_transition"
    assert "already running" in refused.error.detail
    states = {v.uuid: v.state for v in lm.vms.list()}
    assert [states[v] for v in vms] == [
        "pending",
        "pending",
        "running",
        "migrating",
        "migrating",
        "pending",
    ]
    assert audit(lm.store) == []


@pytest.mark.parametrize("junk", [{"vms": ["x"]}, "x", None])
def test_what_is_not_a_request_is_refused_by_name(slm: Loadmaster, junk: object) -> None:
    """A call queues before its requests are checked: what it holds must not break the
    queue, and the caller hears which request is wrong."""
    with pytest.raises(ValidationError) as refused:
        slm.scheduler.schedule([junk])  # type: ignore[list-item]
    assert refused.value.field == "requests[0]"
    assert not slm.scheduler._waiting._tickets
