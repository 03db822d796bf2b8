"""Statements run on the driver's cursor (``store/driver.py``) answer as SQLAlchemy's own
execution of the same statement does, on SQLite and PostgreSQL: the same rows with the
same Python types, the same counts, the same errors, and listeners see them. Each of
these runs with the fast statements on and off (``fast_statements``): the answers are
the same both ways."""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import pq
from sqlalchemy import Text, bindparam, cast, event, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError, NoResultFound

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.pending import claims
from loadmaster.service import Loadmaster
from loadmaster.settings_model import Settings
from loadmaster.store.driver import PLAIN_STATEMENTS, Prepared, pipelined, run, run_many
from loadmaster.store.engine import WriteConflict
from loadmaster.store.schema import HostRow, VmRow
from loadmaster.store.sqlalchemy_internals import SUPPORTED_SQLALCHEMY, check_version

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
_RETAG = Prepared(
    update(_VMS)
    .where(_VMS.c.id == bindparam("vm_id"))
    .values(
        overrides=bindparam("overrides"),
        tags=bindparam("tags"),
        updated_at=bindparam("updated_at"),
    )
)
_RENAME = Prepared(
    update(_HOSTS).where(_HOSTS.c.id == bindparam("host_id")).values(name=bindparam("new_name"))
)


@pytest.fixture(params=[True, False], ids=["fast", "plain"])
def filled(request: pytest.FixtureRequest, db_url: str) -> Iterator[Loadmaster]:
    lm = loadmaster.open(db_url, settings=Settings(fast_statements=request.param))
    try:
        yield _fill(lm)
    finally:
        lm.close()


def _fast(lm: Loadmaster) -> bool:
    return not lm.store.engine.get_execution_options().get(PLAIN_STATEMENTS)


def _fill(lm: Loadmaster) -> Loadmaster:
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
@given(ids=st.lists(st.integers(-2, 16), max_size=60))
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


def test_in_lists_of_every_length_share_a_few_forms_and_the_same_answers(
    filled: Loadmaster,
) -> None:
    """Lists are padded to a few lengths by repeating their last value (a mass start's
    chunks have every length), which changes no row and no count."""
    fresh = Prepared(_VMS_BY_ID.statement)
    with filled.store.read() as session:
        for length in range(1, 300):
            ids = list(range(length, 0, -1))
            assert run(session, fresh, {"ids": ids}).scalars() == list(
                range(1, min(length, 13) + 1)
            )
    assert len(fresh._forms) <= 50  # one a length: 299
    assert bool(fresh._forms) == _fast(filled)  # off: nothing compiled for the driver
    with filled.store.write() as session:
        # 19 pairs (padded to 20 by the last again): two match, the others are missing.
        pairs = [(1, 0), (2, 0), *[(100 + i, 0) for i in range(17)]]
        bumped = run(session, _BUMP_IF, {"pairs": pairs})
        assert bumped.rowcount == 2
        assert sorted(tuple(row) for row in bumped) == [(1, 1), (2, 1)]


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


def test_values_are_written_as_sqlalchemy_writes_them(filled: Loadmaster) -> None:
    """Bind processors of plain parameters, not only of IN lists' members: JSON is
    serialised (the driver takes no dict), SQLite's datetimes are SQLAlchemy's text
    (sqlite3's own adapter drops a whole second's ``.000000``)."""
    at = datetime(2026, 1, 2, 3, 4, 5)
    values = {"overrides": {"VCPU": 3}, "tags": ["gold"], "updated_at": at}
    with filled.store.write() as session:
        run(session, _RETAG, {"vm_id": 1, **values})
        session.connection().execute(_RETAG.statement, {"vm_id": 2, **values})
    with filled.store.read() as session:
        stored = session.connection().execute(
            select(
                cast(VmRow.overrides, Text), cast(VmRow.tags, Text), cast(VmRow.updated_at, Text)
            )
            .where(VmRow.id.in_([1, 2]))
            .order_by(VmRow.id)
        )
        mine, theirs = (tuple(row) for row in stored)
    assert mine == theirs
    with filled.store.read() as session:
        (row,) = run(session, _VMS_BY_ID, {"ids": [1]})
    assert (row.overrides, row.updated_at) == ({"VCPU": 3}, at)


def _round_trips(service: Loadmaster, tmp_path: Path, work: Callable[[], object]) -> int:
    """Round trips to PostgreSQL while ``work`` runs, from libpq's protocol trace of every
    connection it checks out: each turn from the client's messages to the server's."""
    trace = (tmp_path / "trace").open("w")

    def traced(connection: Any, *_: Any) -> None:
        connection.pgconn.trace(trace.fileno())
        connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    event.listen(service.store.engine, "checkout", traced)
    try:
        work()
    finally:
        event.remove(service.store.engine, "checkout", traced)
        trace.close()
    sides = [line[0] for line in (tmp_path / "trace").read_text().splitlines() if line]
    return sum(1 for a, b in itertools.pairwise(sides) if (a, b) == ("F", "B"))


@pytest.mark.postgres
def test_a_claims_writes_swaps_and_clock_are_one_round_trip(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Records, VM rows, the compare-and-swap, consumers and the clock go to PostgreSQL
    together (``pipelined``): four round trips fewer than the same claim without it."""
    service = loadmaster.open(pg_url, settings=Settings(fast_statements=True))
    try:
        service.hosts.create_many(
            [{"name": f"h{i}", "inventories": {"VCPU": {"total": 8}}} for i in range(4)]
        )
        service.flavors.create({"name": "small", "resources": {"VCPU": 1}})
        service.vms.create_many([VmSpec(f"vm-{i}", "small") for i in range(3)])
        first, second, third = (v.uuid for v in service.vms.list())
        service.allocations.claim(first, "h0")
        together = _round_trips(service, tmp_path, lambda: service.allocations.claim(second, "h1"))
        monkeypatch.setattr(claims, "pipelined", lambda _session: contextlib.nullcontext())
        apart = _round_trips(service, tmp_path, lambda: service.allocations.claim(third, "h2"))
        assert {v.host for v in service.vms.list()} == {"h0", "h1", "h2"}
    finally:
        service.close()
    assert together == apart - 4, (together, apart)


@pytest.mark.postgres
def test_a_failure_in_a_pipeline_comes_as_sqlalchemys_and_writes_nothing(pg_url: str) -> None:
    service = loadmaster.open(pg_url, settings=Settings(fast_statements=True))
    try:
        service.hosts.create_many(
            [{"name": f"h{i}", "inventories": {"VCPU": {"total": 8}}} for i in range(3)]
        )
        with pytest.raises(WriteConflict) as caught, service.store.write() as session:
            with pipelined(session):
                renamed = run(session, _RENAME, {"host_id": 1, "new_name": "renamed"})
                run(session, _RENAME, {"host_id": 2, "new_name": "h2"})  # taken by id 3
            assert renamed.rowcount == 1  # not reached: the block's end raised
        assert isinstance(caught.value.__cause__, IntegrityError)
        assert {h.name for h in service.hosts.list()} == {"h0", "h1", "h2"}
        with service.store.write() as session, pipelined(session):
            later = run(session, _RENAME, {"host_id": 1, "new_name": "one"})
            bumped = run(session, _VMS_BY_ID, {"ids": [1, 2]})
            assert later.rowcount == 1 and bumped.all() == []
        assert "one" in {h.name for h in service.hosts.list()}
    finally:
        service.close()


def test_the_supported_sqlalchemy_is_the_pinned_one() -> None:
    """The private API is checked against the version pyproject.toml pins: moving the pin
    without reviewing ``sqlalchemy_internals`` fails here."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if d.lower().startswith("sqlalchemy")]
    assert pins == [f"SQLAlchemy=={SUPPORTED_SQLALCHEMY}"]


def test_another_sqlalchemy_is_refused_at_import_naming_both_versions() -> None:
    with pytest.raises(ImportError) as caught:
        check_version("2.0.99")
    assert "2.0.99" in str(caught.value) and SUPPORTED_SQLALCHEMY in str(caught.value)
    check_version(SUPPORTED_SQLALCHEMY)  # no error
    script = (
        "import sqlalchemy; sqlalchemy.__version__ = '2.0.99'; "
        "import loadmaster.store.sqlalchemy_internals"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0
    assert "SQLAlchemy 2.0.99 is installed" in done.stderr
    assert f"needs SQLAlchemy {SUPPORTED_SQLALCHEMY}" in done.stderr


def test_the_setting_turns_the_fast_statements_off(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LOADMASTER_FAST_STATEMENTS=0``: every statement of a claim goes through
    SQLAlchemy's execution (each cursor execution has its ``before_execute``), and the
    claim's work is done all the same; on, most go to the driver's cursor directly."""
    counted: dict[bool, tuple[int, int]] = {}
    for fast in (True, False):
        monkeypatch.setenv("LOADMASTER_FAST_STATEMENTS", "1" if fast else "0")
        service = loadmaster.open(db_url)
        try:
            assert _fast(service) == fast
            if fast:
                _fill(service)
            seen = {"execute": 0, "cursor": 0}

            def executed(*_: Any, seen: dict[str, int] = seen) -> None:
                seen["execute"] += 1

            def cursor(
                _conn: Any, _cursor: Any, statement: str, *_: Any, seen: dict[str, int] = seen
            ) -> None:
                # A BEGIN is the driver's SQL (``exec_driver_sql``), which has no
                # ``before_execute``.
                seen["cursor"] += not statement.startswith("BEGIN")

            event.listen(service.store.engine, "before_execute", executed)
            event.listen(service.store.engine, "before_cursor_execute", cursor)
            vm = service.vms.list()[int(fast)].uuid
            service.allocations.claim(vm, "h0")
            event.remove(service.store.engine, "before_execute", executed)
            event.remove(service.store.engine, "before_cursor_execute", cursor)
            counted[fast] = (seen["execute"], seen["cursor"])
            assert [v.host for v in service.vms.list() if v.uuid == vm] == ["h0"]
        finally:
            service.close()
    plain_executes, plain_cursor = counted[False]
    fast_executes, fast_cursor = counted[True]
    assert plain_cursor > 0 and plain_executes == plain_cursor, counted
    assert fast_executes < fast_cursor, counted
