"""Calls that arrive while another is deciding are decided together, as Nomad's plan queue
applies the plans that queued up behind one: one snapshot refresh, one decision pass and
one claim transaction for all of them, and each caller still gets its own result.

A scheduler decides one call at a time (its host arrays are not thread-safe), so a server
answering four clients had three of them waiting for the lock, then paying a whole call's
fixed cost (two transactions, a refresh, a commit) for one VM each. Only calls that cannot
tell the difference are merged: best effort (one VM's failure is its own), real (not dry
runs), no seed given, the same policy, and an intent of the same kind: a start and a
plain placement (no intent) go together, as both place a VM that is not running, each
VM resolved and claimed with its own call's intent; migrations and evacuations go with
their own kind. A caller's result reports the seed
its batch was decided with. A call whose requests are refused (a VM that does not exist,
a bad trait) gets its own error; the others go on without it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadmaster.cluster.lookup import canonical_uuid
from loadmaster.errors import LoadmasterError
from loadmaster.scheduler.core.request import RequestSpec
from loadmaster.scheduler.core.results import ScheduleResult
from loadmaster.scheduler.resolve import Resolved, vm_count


def intent_kind(intent: str | None) -> str | None:
    """What calls with ``intent`` may be decided with: a start is a placement."""
    return None if intent == "start" else intent


@dataclass(eq=False)
class Ticket:
    """One caller's ``schedule`` call, waiting to be decided (by itself or by whichever
    call holds the scheduler's lock)."""

    requests: Sequence[RequestSpec]
    # (policy, kind of intent, ``intent_kind``): only calls that agree on both are
    # decided together.
    key: tuple[str, str | None]
    started: float
    intent: str | None = None
    size: int = field(init=False)
    vms: frozenset[str] = field(init=False)
    result: ScheduleResult | None = None
    error: BaseException | None = None

    def __post_init__(self) -> None:
        # Not yet checked (resolve does that, and refuses what is not a RequestSpec).
        specs = [spec for spec in self.requests if isinstance(spec, RequestSpec)]
        self.size = sum(vm_count(spec) for spec in specs)
        self.vms = frozenset(
            canonical_uuid(v) for spec in specs for v in spec.vms or () if isinstance(v, str)
        )

    @property
    def served(self) -> bool:
        return self.result is not None or self.error is not None

    def outcome(self) -> ScheduleResult:
        if self.error is not None:
            raise self.error
        assert self.result is not None, "a ticket is answered before its caller returns"
        return self.result


class Waiting:
    """The calls waiting for the scheduler's lock, oldest first."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._tickets: list[Ticket] = []

    def add(self, ticket: Ticket) -> None:
        with self._mutex:
            self._tickets.append(ticket)

    def take(self, first: Ticket, limit: int) -> list[Ticket]:
        """``first`` and the waiting calls that may join it, oldest first, up to ``limit``
        VMs in all. A call naming a VM the batch already holds waits for the next batch:
        decided together, the second would be refused as "claimed twice in one batch"
        instead of finding the VM already placed."""
        with self._mutex:
            batch, total, vms = [first], first.size, set(first.vms)
            for ticket in self._tickets:
                if (
                    ticket is not first
                    and ticket.key == first.key
                    and total + ticket.size <= limit
                    and vms.isdisjoint(ticket.vms)
                ):
                    batch.append(ticket)
                    total += ticket.size
                    vms |= ticket.vms
            taken = set(map(id, batch))
            self._tickets = [t for t in self._tickets if id(t) not in taken]
        return batch


def merge(
    each: Sequence[Resolved | LoadmasterError],
) -> tuple[Resolved, list[range | LoadmasterError]]:
    """The calls' resolved VMs as one batch, numbered on from one call to the next; per
    call the positions its VMs hold in the batch, or the error that refused it."""
    merged = Resolved([])
    spans: list[range | LoadmasterError] = []
    for resolved in each:
        if isinstance(resolved, LoadmasterError):
            spans.append(resolved)
            continue
        offset = len(merged.items)
        for item in resolved.items:
            item.position += offset
        merged.items.extend(resolved.items)
        merged.groups.update(resolved.groups)
        for group, hosts in resolved.leaving.items():
            merged.leaving.setdefault(group, []).extend(hosts)
        spans.append(range(offset, len(merged.items)))
    return merged, spans
