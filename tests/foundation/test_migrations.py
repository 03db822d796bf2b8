"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from loadmaster.service import Loadmaster
from loadmaster.store.schema import Base


def test_migrated_schema_matches_models(lm: Loadmaster) -> None:
    with lm.store.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_migrating_twice_is_harmless(lm: Loadmaster) -> None:
    lm.hosts.create("h", inventories={"VCPU": {"total": 1}})
    lm.store.migrate()
    assert [h.name for h in lm.hosts.list()] == ["h"]
