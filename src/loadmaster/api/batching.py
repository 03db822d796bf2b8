"""Concurrent ``POST /vms`` requests created in one transaction, as concurrent placements
are decided together (``scheduler/coalesce.py``).

Creating one VM is a write transaction of its own (the flavor's lookup, the consumer and
the VM's rows, the commit), as much as a placement; two VMs in one ``create_many``
cost little more than one. On SQLite every write of the process takes
its turn, so the creates of several operators' tools queued one behind the other, and
behind the claims of the placements they were followed by. Here a create arriving
while another is being written waits for it, and whichever comes next writes every
create waiting then in one ``create_many``.

Each caller still gets its own answer: ``create_many`` writes all of its VMs or none, so
a batch refused as a whole (one bad flavor, one uuid given twice, an unexpected failure)
is written again one VM at a time, and each caller gets what its VM alone would have got.
Only a database out of reach is every caller's answer at once: nothing was written, and
trying each VM again would make the last caller wait out as many timeouts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from loadmaster.errors import StoreUnavailable

Item = TypeVar("Item")
Out = TypeVar("Out")

# VMs per transaction at most (a create's answer waits for its whole batch).
MAX_BATCH = 50


@dataclass(eq=False)
class _Ticket(Generic[Item, Out]):
    item: Item
    result: Out | None = None
    error: BaseException | None = None
    done: bool = False


class Batcher(Generic[Item, Out]):
    """``batcher(item)`` is ``many([item])[0]``, written together with the calls that
    wait meanwhile. ``many`` must write all of its items or none."""

    def __init__(self, many: Callable[[Sequence[Item]], Sequence[Out]], limit: int = MAX_BATCH):
        self._many = many
        self._limit = limit
        # Taken by whichever call writes; the waiting list has its own short lock.
        self._writing = threading.Lock()
        self._mutex = threading.Lock()
        self._waiting: list[_Ticket[Item, Out]] = []

    def __call__(self, item: Item) -> Out:
        ticket: _Ticket[Item, Out] = _Ticket(item)
        with self._mutex:
            self._waiting.append(ticket)
        with self._writing:
            if not ticket.done:
                with self._mutex:
                    # This call's own item and the oldest others waiting, up to the limit.
                    others = [t for t in self._waiting if t is not ticket][: self._limit - 1]
                    batch = [ticket, *others]
                    taken = set(map(id, batch))
                    self._waiting = [t for t in self._waiting if id(t) not in taken]
                self._write(batch)
        if ticket.error is not None:
            raise ticket.error
        return ticket.result  # type: ignore[return-value]

    def _write(self, batch: list[_Ticket[Item, Out]]) -> None:
        if len(batch) > 1:
            try:
                results = self._many([t.item for t in batch])
            except StoreUnavailable as exc:
                for ticket in batch:
                    ticket.error, ticket.done = exc, True
                return
            except Exception:
                pass  # nothing was written: each is written alone below
            else:
                for ticket, result in zip(batch, results, strict=True):
                    ticket.result, ticket.done = result, True
                return
        for ticket in batch:
            try:
                (ticket.result,) = self._many([ticket.item])
            except BaseException as exc:
                ticket.error = exc
            finally:
                ticket.done = True
