"""A full dump of the database, to assert that a refused request changed nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from loadmaster.service import Loadmaster
from loadmaster.store.schema import Base


def dump(lm: Loadmaster) -> dict[str, list[tuple[Any, ...]]]:
    with lm.store.read() as session:
        return {
            table.name: sorted(
                (tuple(row) for row in session.execute(select(table)).all()), key=repr
            )
            for table in Base.metadata.sorted_tables
        }
