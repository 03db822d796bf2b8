"""The hot statements run on the driver's cursor: ``Prepared(statement)`` at import, then
``run(session, prepared, params)`` in the session's transaction.

SQLAlchemy's own execution of a cached Core statement costs tens of microseconds above
the driver's (the execution context, parameter processing, the expansion of ``IN``
lists, result metadata and ``Row`` objects), several times the driver's own work on a
placement's statements (docs/architecture.md has the figures). A ``Prepared`` statement is
compiled once per dialect, set of parameter names and length of its ``IN`` lists, into
the SQL string and a recipe that picks each driver parameter out of the caller's values
(with its type's bind processor); results come back as named tuples with their types'
result processors applied. The connection runs it on the driver's cursor, so event listeners
(the statement counters of tests and benchmarks), echo logging and the wrapping of
driver errors (SQLite's busy, PostgreSQL's serialization failures, a lost connection
invalidated) are as for any other statement. PostgreSQL's driver prepares a statement it
sees five times on the server, and a fixed SQL string per shape lets it.

A statement the recipe cannot serve (Python-side defaults computed at execution,
parameters rendered into the SQL, escaped parameter names) runs through SQLAlchemy. The
parts of SQLAlchemy this takes that are not its public API are in
``store/sqlalchemy_internals.py``.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import DateTime, Executable
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import MultipleResultsFound, NoResultFound

from loadmaster.store.chunks import in_chunks
from loadmaster.store.sqlalchemy_internals import (
    compile_statement,
    cursor_execute,
    cursor_executemany,
    expanding_parameters,
    raise_as_sqlalchemys,
    result_processor,
)
from loadmaster.store.transaction import Transaction

# Forms kept per statement: one per dialect and length of each IN list. A placement's
# lists are short; a mass start's vary with its chunks, and past this many a shape is
# compiled for the call and not kept.
MAX_FORMS = 512

Params = Mapping[str, Any]

# The engine's execution option (``Store(fast_statements=False)``) under which every
# statement here runs through SQLAlchemy's own execution, none on the driver's cursor:
# the answers are the same, so the fast path can be ruled out when chasing a fault.
PLAIN_STATEMENTS = "loadmaster_plain_statements"


class Rows:
    """What a prepared statement returned: its rows (named tuples), or the number of
    rows it changed. The subset of SQLAlchemy's ``Result`` that callers use. In a
    pipeline (``pipelined``), read from the server when first wanted."""

    __slots__ = ("_pending", "_rowcount", "_rows")

    def __init__(
        self,
        rows: list[Any],
        rowcount: int,
        pending: Callable[[], tuple[list[Any], int]] | None = None,
    ) -> None:
        self._rows, self._rowcount, self._pending = rows, rowcount, pending

    def _read(self) -> list[Any]:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._rows, self._rowcount = pending()
        return self._rows

    @property
    def rowcount(self) -> int:
        self._read()
        return self._rowcount

    def __iter__(self) -> Iterator[Any]:
        return iter(self._read())

    def all(self) -> list[Any]:
        return self._read()

    def first(self) -> Any:
        rows = self._read()
        return rows[0] if rows else None

    def one(self) -> Any:
        rows = self._read()
        if len(rows) != 1:
            raise (NoResultFound if not rows else MultipleResultsFound)(
                f"expected one row, got {len(rows)}"
            )
        return rows[0]

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalars(self) -> list[Any]:
        return [row[0] for row in self._read()]


@dataclass
class _Form:
    """One shape of a prepared statement, ready for the driver."""

    sql: str
    # Per driver parameter: (name in the caller's values or None for a constant, index
    # into a list value or -1, index into a tuple within it or -1, the constant, the bind
    # processor or None).
    binds: list[tuple[str | None, int, int, Any, Callable[[Any], Any] | None]]
    # The driver's parameter names (a named paramstyle), or None (positional).
    names: list[str] | None
    row: Any  # the named tuple class of the result's rows, or None
    result_types: list[Any]
    # The result columns that have a processor, with it: set at the first execution,
    # from the cursor's description.
    steps: list[tuple[int, Callable[[Any], Any]]] | None = None

    def values(self, params: Params) -> Any:
        out = []
        for name, index, member, constant, process in self.binds:
            if name is None:
                value = constant
            else:
                value = params[name]
                if index >= 0:
                    value = value[index]
                    if member >= 0:
                        value = value[member]
            out.append(value if process is None else process(value))
        return tuple(out) if self.names is None else dict(zip(self.names, out, strict=True))


@dataclass(eq=False)
class Prepared:
    """A statement built once at import and run with ``run``."""

    statement: Executable
    _forms: dict[tuple[Any, ...], _Form | None] = field(default_factory=dict, repr=False)
    # The names of its IN lists' parameters.
    _lists: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._lists = expanding_parameters(self.statement)

    def padded(self, params: Params) -> Params:
        """``params`` with each IN list grown to its length's bucket (``_bucket``) by
        repeating its last value, which changes no answer: a mass start's chunks, whose
        lists have every length, then share a few dozen forms instead of compiling
        one each (a compile costs milliseconds)."""
        if not self._lists:
            return params
        out = dict(params)
        for name in self._lists & params.keys():
            value = params[name]
            if isinstance(value, list | tuple) and value:
                missing = _bucket(len(value)) - len(value)
                if missing:
                    out[name] = [*value, *[value[-1]] * missing]
        return out

    def form(self, dialect: Dialect, params: Params) -> _Form | None:
        key = (
            type(dialect),
            dialect.server_version_info,
            tuple(
                sorted(
                    # An IN list's length; any other value binds as one, lists too (JSON).
                    (name, len(value) if name in self._lists else -1)
                    for name, value in params.items()
                )
            ),
        )
        try:
            return self._forms[key]
        except KeyError:
            made = _compile(self.statement, dialect, params)
            if len(self._forms) < MAX_FORMS:
                self._forms[key] = made
            return made


def _bucket(length: int) -> int:
    """The length an IN list is padded to: itself up to 16, then the next multiple of an
    eighth to a sixteenth of its power of two (at most 1/8 more values)."""
    if length <= 16:
        return length
    step = 1 << (length.bit_length() - 4)
    return -(-length // step) * step


def run_chunked(
    session: Transaction,
    prepared: Prepared,
    name: str,
    values: Sequence[Any],
    params: Params | None = None,
) -> list[Any]:
    """``prepared`` once per piece of ``values`` (an IN list bound to ``name``, cut as
    ``in_chunks`` cuts it), with ``params`` besides; the rows of all, in order. For
    reads: in a pipeline (``pipelined``) reading the rows waits for the answers."""
    return [
        row
        for chunk in in_chunks(values)
        for row in run(session, prepared, {**(params or {}), name: chunk})
    ]


def run(session: Transaction, prepared: Prepared, params: Params | None = None) -> Rows:
    """``prepared`` in the session's transaction, after the ORM's autoflush as an ORM
    statement would have it."""
    session.flush()
    connection = session.connection()
    if _plain(connection):
        return _through_sqlalchemy(connection, prepared.statement, params or {})
    params = prepared.padded(params or {})
    form = prepared.form(connection.dialect, params)
    if form is None:
        return _through_sqlalchemy(connection, prepared.statement, params)
    return _execute(connection, form, form.values(params), session.info.get(_PIPELINE))


def _plain(connection: Connection) -> bool:
    return bool(connection.get_execution_options().get(PLAIN_STATEMENTS))


def _through_sqlalchemy(connection: Connection, statement: Executable, params: Params) -> Rows:
    result = connection.execute(statement, dict(params))
    rows = list(result) if result.returns_rows else []
    return Rows(rows, result.rowcount if not result.returns_rows else len(rows))


class _Batch:
    """A pipeline of psycopg's, open until ``end``."""

    def __init__(
        self, session: Transaction, connection: Connection, raw: psycopg.Connection
    ) -> None:
        self._session, self._connection = session, connection
        self._mode = raw.pipeline()
        self.pipeline: Any = self._mode.__enter__()
        self.open = True
        session.info[_PIPELINE] = self

    def end(self, failure: BaseException | None = None) -> None:
        """Everything queued sent, and every answer read: one round trip."""
        if not self.open:
            return
        self.open = False
        del self._session.info[_PIPELINE]
        try:
            # With a failure already on its way, psycopg logs its own and does not raise.
            if failure is None:
                self._mode.__exit__(None, None, None)
            else:
                self._mode.__exit__(type(failure), failure, failure.__traceback__)
        except psycopg.Error as exc:
            raise_as_sqlalchemys(self._connection, exc, "(pipeline)", None, None)


@contextmanager
def pipelined(session: Transaction) -> Iterator[Callable[[], None]]:
    """On PostgreSQL, the statements ``run`` and ``run_many`` send in the block go to the
    server without waiting for each answer (psycopg's pipeline mode): the server answers
    them all when the block ends, or earlier when the function the block is given is
    called (answers read after it need no further round trip), or when a result is read
    before (one round trip more). Errors come as SQLAlchemy's, at the latest when the
    pipeline ends. On SQLite (no round trips), and inside another pipeline, the block
    changes nothing, and so it does with the fast statements off (``PLAIN_STATEMENTS``)."""
    session.flush()
    connection = session.connection()
    raw = connection.connection.dbapi_connection
    if not isinstance(raw, psycopg.Connection) or _PIPELINE in session.info or _plain(connection):
        yield lambda: None
        return
    batch = _Batch(session, connection, raw)
    try:
        yield batch.end
    except BaseException as exc:
        batch.end(exc)
        raise
    batch.end()


_PIPELINE = "loadmaster_pipeline"


def _cursor(connection: Connection) -> Any:
    raw = connection.connection.dbapi_connection
    # psycopg's own cursor rewrites every query's %(name)s into $1 and keeps the result
    # only for short queries, a cost every placement on PostgreSQL paid; a RawCursor
    # takes the $1 form ``compile_statement`` produced.
    return psycopg.RawCursor(raw) if isinstance(raw, psycopg.Connection) else raw.cursor()  # type: ignore[union-attr]


def _execute(connection: Connection, form: _Form, values: Any, batch: _Batch | None = None) -> Rows:
    cursor = _cursor(connection)
    if batch is None:
        try:
            cursor_execute(connection, cursor, form.sql, values)
            return Rows(*_answer(connection, form, cursor))
        finally:
            cursor.close()
    try:
        cursor_execute(connection, cursor, form.sql, values)
    except BaseException:
        cursor.close()
        raise

    def answer() -> tuple[list[Any], int]:
        try:
            if form.row is None and batch.open:
                batch.pipeline.sync()  # a count only: no fetch asks the server for it
            return _answer(connection, form, cursor)
        except psycopg.Error as exc:
            raise_as_sqlalchemys(connection, exc, form.sql, values, cursor)
        finally:
            cursor.close()

    return Rows([], -1, answer)


def _answer(connection: Connection, form: _Form, cursor: Any) -> tuple[list[Any], int]:
    """The rows of the statement ``cursor`` ran (a row-less one: the count it changed)."""
    if form.row is None:
        return [], cursor.rowcount
    fetched = cursor.fetchall()
    description = cursor.description
    if form.steps is None:
        processors = [
            result_processor(kind, connection.dialect, column[1])
            for kind, column in zip(form.result_types, description, strict=True)
        ]
        form.steps = [(i, p) for i, p in enumerate(processors) if p is not None]
    make, steps = form.row._make, form.steps
    if not steps:
        return [make(row) for row in fetched], len(fetched)
    out = []
    for row in fetched:
        values = list(row)
        for i, process in steps:
            values[i] = process(values[i])
        out.append(make(values))
    return out, len(fetched)


def _compile(statement: Executable, dialect: Dialect, params: Params) -> _Form | None:
    compiled = compile_statement(statement, dialect, dict(params))
    if compiled is None:
        return None
    origin: dict[str, tuple[str, int, int]] = {}
    for name, expanded in compiled.expansion.items():
        if name not in params:
            continue  # a list the statement holds itself (``column.in_([...])``): constants
        value = params[name]
        width = len(value[0]) if value and isinstance(value[0], tuple) else 0
        for k, member_name in enumerate(expanded):
            origin[member_name] = (name, k // width, k % width) if width else (name, k, -1)
    binds: list[tuple[str | None, int, int, Any, Callable[[Any], Any] | None]] = []
    for name in compiled.names:
        process = compiled.processors.get(name)
        kind = compiled.bind_types.get(origin[name][0] if name in origin else name)
        if process is not None and isinstance(kind, DateTime):
            process = _remembering(process)
        if name in origin:
            binds.append((*origin[name], None, process))
        elif name in params:
            binds.append((name, -1, -1, None, process))
        else:
            binds.append((None, -1, -1, compiled.parameters[name], process))
    columns = [name for name, _kind in compiled.result_columns]
    return _Form(
        compiled.sql,
        binds,
        None if compiled.positional else compiled.names,
        namedtuple("Row", columns, rename=True) if columns else None,
        [kind for _name, kind in compiled.result_columns],
    )


def _remembering(process: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A datetime's bind processor that keeps its last answer: a batch's rows carry one
    stamp, and SQLite's processor formats it as text anew for each (a mass start's chunk
    is 1,500 records). Only for datetimes: they are immutable, so the same object
    is the same value."""
    last: tuple[Any, Any] = (_UNSET, None)

    def remembered(value: Any) -> Any:
        nonlocal last
        seen, answer = last  # one read: another thread may replace it meanwhile
        if value is not seen:
            answer = process(value)
            last = (value, answer)
        return answer

    return remembered


_UNSET = object()


def run_many(session: Transaction, prepared: Prepared, rows: Sequence[Params]) -> None:
    """``prepared`` once per row (an INSERT or UPDATE, each row with the same keys and
    no IN list), handed to the driver's ``executemany``; one row is one execution."""
    if not rows:
        return
    session.flush()
    connection = session.connection()
    form = None if _plain(connection) else prepared.form(connection.dialect, rows[0])
    if form is None:
        connection.execute(prepared.statement, [dict(r) for r in rows])
        return
    if len(rows) == 1:
        _execute(connection, form, form.values(rows[0]), session.info.get(_PIPELINE))
        return
    values = [form.values(r) for r in rows]
    batch = session.info.get(_PIPELINE)
    cursor = _cursor(connection)
    try:
        cursor_executemany(connection, cursor, form.sql, values)
    finally:
        if batch is None:  # in a pipeline, its answer is still to come
            cursor.close()
