"""Placement writes that touch several consumers, or a reshape that touches inventories
and allocations, lock every host they touch in one pass, in id order: two such writes
over crossing hosts queue up on PostgreSQL instead of deadlocking (which PostgreSQL
would break by failing one of them with a 409)."""

from __future__ import annotations

import threading
import uuid as uuidlib
from collections.abc import Callable

import pytest

import loadmaster
from loadmaster.errors import ConcurrentUpdate
from loadmaster.pending.consumers import ConsumerWrite
from loadmaster.pending.reshape import ProviderInventories
from loadmaster.resources import Inventory
from loadmaster.service import Loadmaster

pytestmark = pytest.mark.postgres
ROUNDS = 40


def _consumer(i: int, side: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{side}{i}"))


def _race(url: str, writers: list[Callable[[Loadmaster, int], None]]) -> list[str]:
    """Each writer on its own service and thread, ROUNDS times, started together each
    round; the refusals they met."""
    lost: list[str] = []
    services = [loadmaster.open(url) for _ in writers]
    barrier = threading.Barrier(len(writers))

    def run(write: Callable[[Loadmaster, int], None], lm: Loadmaster) -> None:
        for i in range(ROUNDS):
            barrier.wait()
            try:
                write(lm, i)
            except ConcurrentUpdate as exc:
                lost.append(exc.detail)

    threads = [
        threading.Thread(target=run, args=pair) for pair in zip(writers, services, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for lm in services:
        lm.close()
    return lost


def _two_hosts(url: str) -> tuple[str, str]:
    with loadmaster.open(url) as lm:
        made = [lm.hosts.create(n, inventories={"VCPU": {"total": 10_000}}) for n in "ab"]
    return made[0].uuid, made[1].uuid


def test_multi_consumer_writes_over_crossing_hosts_never_deadlock(pg_url: str) -> None:
    a, b = _two_hosts(pg_url)

    def writer(first: str, second: str, side: str) -> Callable[[Loadmaster, int], None]:
        def write(lm: Loadmaster, i: int) -> None:
            lm.allocations.write_consumers(
                [
                    ConsumerWrite(_consumer(i, side + "1"), {first: {"VCPU": 1}}, "p", "u"),
                    ConsumerWrite(_consumer(i, side + "2"), {second: {"VCPU": 1}}, "p", "u"),
                ]
            )

        return write

    assert _race(pg_url, [writer(a, b, "x"), writer(b, a, "y")]) == []


def test_reshapes_over_crossing_hosts_never_deadlock(pg_url: str) -> None:
    a, b = _two_hosts(pg_url)

    def reshaper(mine: str, theirs: str, side: str) -> Callable[[Loadmaster, int], None]:
        def write(lm: Loadmaster, i: int) -> None:
            generation = lm.hosts.get(mine).generation
            lm.allocations.reshape(
                [ProviderInventories(mine, generation, {"VCPU": Inventory(10_000 + i)})],
                [ConsumerWrite(_consumer(i, side), {theirs: {"VCPU": 1}}, "p", "u")],
            )

        return write

    lost = _race(pg_url, [reshaper(a, b, "x"), reshaper(b, a, "y")])
    # A reshape reads its provider's generation before its transaction: the other one
    # may move it first (a 409 Placement's clients retry); a deadlock is never the cause.
    assert [d for d in lost if "deadlock" in d] == []
