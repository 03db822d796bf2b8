"""No deadlock on PostgreSQL between deleting a placed server-group member and claiming
another member on the same host (issue 13, defect 2).

The delete updates the VM row twice, so PostgreSQL re-checks its foreign keys and takes
FOR KEY SHARE on the group row, which a claim holds FOR UPDATE while it waits for the host
row the delete holds. Every writer now locks VM, group, then hosts. The database's own
deadlock counter must not move."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

import pytest
from sqlalchemy import text

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.errors import LoadmasterError

THREADS = 4
ROUNDS = 25


def _deadlocks(lm: loadmaster.Loadmaster) -> int:
    with lm.store.engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        value = conn.execute(
            text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        ).scalar_one()
    return int(value)


def _run_together(work: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=w) for w in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)


@pytest.mark.postgres
def test_deleting_and_claiming_group_members_never_deadlocks(pg_url: str) -> None:
    lm = loadmaster.open(pg_url)
    try:
        lm.hosts.create("h", inventories={"VCPU": {"total": 1000}, "MEMORY_MB": {"total": 10**6}})
        lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 16}})
        lm.groups.create("g", "affinity")
        members = [
            [
                v.uuid
                for v in lm.vms.create_many(
                    [VmSpec(f"t{t}-{i}", "f", group="g") for i in range(ROUNDS)]
                )
            ]
            for t in range(THREADS)
        ]
        before = _deadlocks(lm)
        errors: list[LoadmasterError] = []
        start = threading.Barrier(THREADS)

        def churn(mine: list[str]) -> None:
            start.wait()
            for vm in mine:
                try:
                    lm.allocations.claim(vm, "h")
                    lm.allocations.delete(vm)
                except LoadmasterError as exc:
                    errors.append(exc)

        _run_together([partial(churn, m) for m in members])
        assert errors == []
        assert _deadlocks(lm) - before == 0
        assert lm.allocations.allocations() == []
    finally:
        lm.close()


@pytest.mark.postgres
def test_deleting_a_group_while_its_deleted_member_is_deleted_again_never_deadlocks(
    pg_url: str,
) -> None:
    """The group delete unlinks its deleted members (VM rows) and a retried VM delete
    takes the group's key-share lock after its VM row: both go VM first, then group."""
    lm = loadmaster.open(pg_url)
    try:
        lm.flavors.create({"name": "f", "resources": {"VCPU": 1}})
        members = []
        for r in range(ROUNDS * 2):
            lm.groups.create(f"g{r}", "affinity")
            vm = lm.vms.create(f"m{r}", "f", group=f"g{r}").uuid
            lm.allocations.delete(vm)
            members.append(vm)
        before = _deadlocks(lm)
        errors: list[LoadmasterError] = []
        step = threading.Barrier(2)

        def groups() -> None:
            for r in range(len(members)):
                step.wait(timeout=60)
                try:
                    lm.groups.delete(f"g{r}")
                except LoadmasterError as exc:
                    errors.append(exc)

        def retries() -> None:
            for vm in members:
                step.wait(timeout=60)
                try:
                    lm.allocations.delete(vm)
                except LoadmasterError as exc:
                    errors.append(exc)

        _run_together([groups, retries])
        assert errors == []
        assert _deadlocks(lm) - before == 0
        assert lm.groups.list() == []
    finally:
        lm.close()
