"""Statements run on the driver's cursor (``store/driver.py``) answer as SQLAlchemy's own
execution of the same statement does, on SQLite and PostgreSQL: the same rows with the
same Python types, the same counts, the same errors, and listeners see them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import bindparam, event, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError, NoResultFound

from loadmaster.cluster import VmSpec
from loadmaster.service import Loadmaster
from loadmaster.store.driver import Prepared, run, run_many
from loadmaster.store.engine import WriteConflict
from loadmaster.store.schema import HostRow, VmRow

_VMS = VmRow.metadata.tables["vms"]
_HOSTS = HostRow.metadata.tables["hosts"]
# Types with processors on one backend or the other: a datetime (text on SQLite), JSON,
# an integer, nullable columns; an IN list of any length given as a parameter, and one
# the statement holds.
_VMS_BY_ID = Prepared(
    select(VmRow.id, VmRow.uuid, VmRow.overrides, VmRow.updated_at, VmRow.host_id)
    .where(
        VmRow.id.in_(bindparam("ids", expanding=True)),
        VmRow.state.in_(["requested", "pending"]),
    )
    .order_by(VmRow.id)
)
# A row-value IN of pairs, and RETURNING.
_BUMP_IF = Prepared(
    update(_HOSTS)
    .where(tuple_(_HOSTS.c.id, _HOSTS.c.generation).in_(bindparam("pairs", expanding=True)))
    .values(generation=_HOSTS.c.generation + 1)
    .returning(_HOSTS.c.id, _HOSTS.c.generation)
)
_RENAME = Prepared(
    update(_HOSTS).where(_HOSTS.c.id == bindparam("host_id")).values(name=bindparam("new_name"))
)


@pytest.fixture
def filled(lm: Loadmaster) -> Loadmaster:
    lm.hosts.create_many(
        [{"name": f"h{i}", "inventories": {"VCPU": {"total": 8}}} for i in range(6)]
    )
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1}})
    lm.vms.create_many([VmSpec(f"vm-{i}", "small") for i in range(12)])
    lm.vms.create("tuned", "small", overrides={"VCPU": 2})
    return lm


def _through_sqlalchemy(lm: Loadmaster, prepared: Prepared, params: dict[str, Any]) -> list[Any]:
    with lm.store.read() as session:
        return [tuple(row) for row in session.connection().execute(prepared.statement, params)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ids=st.lists(st.integers(-2, 16), max_size=14))
def test_rows_and_types_are_sqlalchemys(filled: Loadmaster, ids: list[int]) -> None:
    with filled.store.read() as session:
        mine = run(session, _VMS_BY_ID, {"ids": ids}).all()
    theirs = _through_sqlalchemy(filled, _VMS_BY_ID, {"ids": ids})
    assert [tuple(row) for row in mine] == theirs
    for row in mine:
        assert isinstance(row.updated_at, datetime)
        assert isinstance(row.overrides, dict)
    if 13 in ids:
        assert [row.overrides for row in mine if row.id == 13] == [{"VCPU": 2}]


def test_pairs_returning_and_counts(filled: Loadmaster) -> None:
    with filled.store.write() as session:
        bumped = run(session, _BUMP_IF, {"pairs": [(1, 0), (2, 99), (3, 0)]})
        assert sorted(tuple(row) for row in bumped) == [(1, 1), (3, 1)]
        assert bumped.rowcount == 2
        assert run(session, _RENAME, {"host_id": 4, "new_name": "four"}).rowcount == 1
        assert run(session, _RENAME, {"host_id": 999, "new_name": "none"}).rowcount == 0
        one = run(session, _VMS_BY_ID, {"ids": [5]})
        assert one.scalar_one() == 5
        assert run(session, _VMS_BY_ID, {"ids": [1, 2]}).scalars() == [1, 2]
        with pytest.raises(NoResultFound):
            run(session, _VMS_BY_ID, {"ids": []}).one()
    names = {h.name for h in filled.hosts.list()}
    assert "four" in names and "h3" not in names  # ids count from 1


def test_listeners_see_each_statement(filled: Loadmaster) -> None:
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement)

    event.listen(filled.store.engine, "before_cursor_execute", note)
    try:
        with filled.store.read() as session:
            run(session, _VMS_BY_ID, {"ids": [1, 2, 3]})
    finally:
        event.remove(filled.store.engine, "before_cursor_execute", note)
    selects = [s for s in seen if not s.startswith("BEGIN")]
    assert len(selects) == 1 and "FROM vms" in selects[0]


def test_driver_errors_come_as_sqlalchemys_and_write_nothing(filled: Loadmaster) -> None:
    taken = filled.hosts.list()[0].name
    # The store turns the driver's IntegrityError, wrapped as SQLAlchemy's, into its own.
    with pytest.raises(WriteConflict) as caught, filled.store.write() as session:
        run(session, _RENAME, {"host_id": 2, "new_name": "renamed"})
        run(session, _RENAME, {"host_id": 3, "new_name": taken})  # names are unique
    assert isinstance(caught.value.__cause__, IntegrityError)
    assert "renamed" not in {h.name for h in filled.hosts.list()}


def test_many_rows_and_one_row(filled: Loadmaster) -> None:
    with filled.store.write() as session:
        run_many(session, _RENAME, [{"host_id": 1, "new_name": "a1"}])
        run_many(
            session,
            _RENAME,
            [{"host_id": 2, "new_name": "a2"}, {"host_id": 3, "new_name": "a3"}],
        )
    assert {"a1", "a2", "a3"} <= {h.name for h in filled.hosts.list()}


def test_a_statement_with_python_side_defaults_runs_through_sqlalchemy(
    filled: Loadmaster,
) -> None:
    """The recipe has no value for a default computed at execution (a resource class's
    description): SQLAlchemy runs that statement, and the default is written."""
    statement = Prepared(insert(VmRow.metadata.tables["resource_classes"]))
    row = {"name": "CUSTOM_DEFAULTED", "kind": "custom", "unit": "thing"}
    with filled.store.write() as session:
        assert statement.form(session.connection().dialect, row) is None
        run_many(session, statement, [row])
    made = filled.resource_classes.get("CUSTOM_DEFAULTED")
    assert made.description == ""
