"""A bulk load of hosts refreshes PostgreSQL's planner statistics at once: until
autovacuum gets to fresh tables, the planner estimates a third of the hosts for the
scheduler's "changed since" read and scans them all instead of using the index."""

from __future__ import annotations

import pytest
from sqlalchemy import text

import loadmaster
from loadmaster.cluster.hosts import BULK_LOAD


def _planned_rows(lm: loadmaster.Loadmaster) -> float:
    with lm.store.engine.connect() as connection:
        return float(
            connection.execute(
                text("SELECT reltuples FROM pg_class WHERE relname = 'hosts'")
            ).scalar_one()
        )


def _hosts(count: int, prefix: str) -> list[dict[str, object]]:
    return [{"name": f"{prefix}{i}", "inventories": {"VCPU": {"total": 8}}} for i in range(count)]


@pytest.mark.postgres
def test_a_bulk_load_is_analyzed_and_a_small_one_is_left_to_autovacuum(pg_url: str) -> None:
    lm = loadmaster.open(pg_url)
    try:
        lm.hosts.create_many(_hosts(10, "small-"))
        # Never analyzed: PostgreSQL says -1 (unknown), so the planner guesses.
        assert _planned_rows(lm) < 0
        lm.hosts.create_many(_hosts(BULK_LOAD, "bulk-"))
        assert _planned_rows(lm) == BULK_LOAD + 10
        with lm.store.engine.connect() as connection:
            plan = "\n".join(
                connection.execute(
                    text("EXPLAIN SELECT id FROM hosts WHERE changed_seq > 1000000")
                ).scalars()
            )
        assert "ix_hosts_changed_seq" in plan
    finally:
        lm.close()
