"""No deadlock on PostgreSQL between deleting a placed server-group member and claiming
another member on the same host (issue 13, defect 2).

The delete updates the VM row twice, so PostgreSQL re-checks its foreign keys and takes
FOR KEY SHARE on the group row, which a claim holds FOR UPDATE while it waits for the host
row the delete holds. Every writer now locks VM, group, then hosts. The database's own
deadlock counter must not move."""

from __future__ import annotations

import threading

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

        threads = [threading.Thread(target=churn, args=(m,)) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == []
        assert _deadlocks(lm) - before == 0
        assert lm.allocations.allocations() == []
    finally:
        lm.close()
