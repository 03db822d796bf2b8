"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, select, text

import loadmaster
from loadmaster.pending import audit
from loadmaster.service import Loadmaster
from loadmaster.store import Store
from loadmaster.store.schema import Base, ConsumerRow


def test_migrated_schema_matches_models(lm: Loadmaster) -> None:
    with lm.store.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_migrating_twice_is_harmless(lm: Loadmaster) -> None:
    lm.hosts.create("h", inventories={"VCPU": {"total": 1}})
    lm.store.migrate()
    assert [h.name for h in lm.hosts.list()] == ["h"]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    server = request.getfixturevalue("pg_server")
    name = f"lm_old_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return server.rsplit("/", 1)[0] + "/" + name


def test_vms_and_their_records_become_consumers(empty_url: str) -> None:
    """A database from before generic consumers (0004) keeps every VM and record: each
    VM becomes the consumer of its uuid and its records move onto it."""
    store = Store(empty_url)
    store.migrate("0004_cluster_clock")
    stamp = "2026-01-01 00:00:00"
    vm = str(uuid.uuid4())
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO resource_classes (id, name, kind, unit, description) VALUES (900, 'CUSTOM_OLD', 'custom', 'unit', '')"
            )
        )
        conn.execute(
            text(
                f"INSERT INTO hosts (id, uuid, name, state, generation, changed_seq, created_at, updated_at) VALUES (1, '{uuid.uuid4()}', 'h', 'up', 3, 0, '{stamp}', '{stamp}')"
            )
        )
        conn.execute(text("UPDATE hosts SET root_id = 1"))
        conn.execute(
            text(
                "INSERT INTO inventories (host_id, resource_class_id, total, reserved, min_unit, max_unit, step_size, allocation_ratio) VALUES (1, 900, 4, 0, 1, 4, 1, 1.0)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO flavors (id, name, resources, required_traits, forbidden_traits, extra_specs) VALUES (1, 'f', '{\"CUSTOM_OLD\": 2}', '[]', '[]', '{}')"
            )
        )
        conn.execute(
            text(
                f"INSERT INTO vms (id, uuid, name, project_id, user_id, flavor_id, overrides, tags, state, host_id, generation, tried_hosts, created_at, updated_at) VALUES (7, '{vm}', 'v', 'p', 'u', 1, '{{}}', '[]', 'running', 1, 2, '[]', '{stamp}', '{stamp}')"
            )
        )
        conn.execute(
            text(
                f"INSERT INTO allocations (vm_id, host_id, resource_class_id, amount, state, created_at) VALUES (7, 1, 900, 2, 'active', '{stamp}')"
            )
        )
    store.engine.dispose()
    lm = loadmaster.open(empty_url)
    try:
        assert [
            (a.vm, a.host, a.resource_class, a.amount, a.state)
            for a in lm.allocations.allocations()
        ] == [(vm, "h", "CUSTOM_OLD", 2, "active")]
        assert lm.vms.get(vm).state == "running"
        assert audit(lm.store) == []
        with lm.store.read() as session:
            consumer = session.execute(
                select(
                    ConsumerRow.uuid,
                    ConsumerRow.project_id,
                    ConsumerRow.user_id,
                    ConsumerRow.generation,
                )
            ).one()
        assert tuple(consumer) == (vm, "p", "u", 2)
        lm.allocations.stop(vm)
        assert lm.allocations.allocations() == []
    finally:
        lm.close()
