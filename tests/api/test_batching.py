"""Concurrent VM creates written together (``api/batching.py``): one transaction for the
creates that waited meanwhile, and each caller still gets its own VM's answer."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import loadmaster
from loadmaster.api.batching import Batcher, _Ticket
from loadmaster.cluster import VmSpec
from loadmaster.errors import NotFound, StoreUnavailable, ValidationError


class _Writes:
    """A ``many`` that writes all of its items or none (a "bad" item refuses the whole
    call), blocking its first call until released so that others queue behind it."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.first = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: Sequence[str]) -> list[str]:
        self.calls.append(list(items))
        if len(self.calls) == 1:
            self.first.set()
            assert self.release.wait(10)
        for i, item in enumerate(items):
            if item.startswith("bad"):
                prefix = f"vms[{i}]." if len(items) > 1 else ""
                raise ValidationError(f"{prefix}name: bad", field=f"{prefix}name")
        return [f"made {item}" for item in items]


def _queue_behind_first(writes: _Writes, items: list[str]) -> list[object]:
    """``items[0]`` written alone (blocked), the others called meanwhile; each one's
    answer or error."""
    batcher: Batcher[str, str] = Batcher(writes)

    def call(item: str) -> object:
        try:
            return batcher(item)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(items)) as pool:
        first = pool.submit(call, items[0])
        assert writes.first.wait(10)
        rest = [pool.submit(call, item) for item in items[1:]]
        # Every other call waits for the writer's lock before it is let go.
        while len(batcher._waiting) < len(items) - 1:
            threading.Event().wait(0.001)
        writes.release.set()
        return [first.result(), *(f.result() for f in rest)]


def test_calls_made_while_one_is_written_are_written_together() -> None:
    writes = _Writes()
    answers = _queue_behind_first(writes, ["a", "b", "c", "d"])
    assert answers == ["made a", "made b", "made c", "made d"]
    assert writes.calls[0] == ["a"]
    assert sorted(writes.calls[1]) == ["b", "c", "d"] and len(writes.calls) == 2


def test_a_refused_batch_is_written_one_by_one_each_getting_its_own_answer() -> None:
    writes = _Writes()
    answers = _queue_behind_first(writes, ["a", "b", "bad", "d"])
    assert answers[:2] == ["made a", "made b"] and answers[3] == "made d"
    error = answers[2]
    # The error the VM alone gets: its field is not prefixed with a batch position.
    assert isinstance(error, ValidationError) and error.field == "name"
    assert [sorted(c) for c in writes.calls[1:]] == [["b", "bad", "d"], ["b"], ["bad"], ["d"]]


def test_an_unreachable_database_is_every_callers_answer_at_once() -> None:
    calls: list[list[str]] = []
    gate = threading.Event()

    def many(items: Sequence[str]) -> list[str]:
        calls.append(list(items))
        if len(calls) == 1:
            assert gate.wait(10)
            return ["made"]
        raise StoreUnavailable("the database is away")

    batcher: Batcher[str, str] = Batcher(many)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(batcher, "a")
        while not calls:
            threading.Event().wait(0.001)
        rest = [pool.submit(batcher, item) for item in ("b", "c")]
        while len(batcher._waiting) < 2:
            threading.Event().wait(0.001)
        gate.set()
        assert first.result() == "made"
        for future in rest:
            with pytest.raises(StoreUnavailable):
                future.result()
    assert len(calls) == 2  # not tried again VM by VM


def test_vm_creates_through_the_batcher(tmp_path: Path) -> None:
    """The real ``create_many``: a batch with one unknown flavor writes the others, and
    the bad one gets the error it gets alone."""
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'b.db'}")
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1}})
    batcher = Batcher(lm.vms.create_many)
    given = str(uuid.uuid4())
    # The waiting calls' tickets, as the writer takes them.
    tickets = [
        _Ticket(VmSpec("a", "small", uuid=given)),
        _Ticket(VmSpec("b", "nope")),
        _Ticket(VmSpec("c", "small")),
    ]
    batcher._write(tickets)
    assert [t.done for t in tickets] == [True, True, True]
    assert tickets[0].result is not None and tickets[0].result.uuid == given
    assert isinstance(tickets[1].error, NotFound) and tickets[1].error.field == "flavor"
    assert tickets[2].result is not None and tickets[2].result.name == "c"
    assert sorted(v.name for v in lm.vms.list()) == ["a", "c"]
    # Together when all are good: one transaction, answers in the callers' order.
    tickets = [_Ticket(VmSpec(name, "small")) for name in ("d", "e")]
    batcher._write(tickets)
    assert [t.result.name for t in tickets if t.result is not None] == ["d", "e"]
    lm.close()
