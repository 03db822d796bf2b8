"""Every use of SQLAlchemy's private API, for the fast statements (``store/driver.py``)
and the SQLite BEGIN (``store/engine.py``): a compiled statement's SQL, parameters and
types, its result processors, and the connection's execution of a driver cursor with
SQLAlchemy's events and error wrapping.

None of this is SQLAlchemy's public contract, so it is checked against one version: the
one pyproject.toml pins. Importing this module under any other version fails, naming
both; an upgrade of SQLAlchemy reviews this module (and runs tests/foundation/test_driver.py
both ways) before moving the pin and ``SUPPORTED_SQLALCHEMY`` together.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import sqlalchemy
from sqlalchemy import BindParameter, Executable
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.visitors import iterate
from sqlalchemy.types import TypeEngine

SUPPORTED_SQLALCHEMY = "2.1.9"


def check_version(installed: str) -> None:
    """Refuse a SQLAlchemy other than the one this module was written against."""
    if installed != SUPPORTED_SQLALCHEMY:
        raise ImportError(
            f"loadmaster needs SQLAlchemy {SUPPORTED_SQLALCHEMY} (the version pinned in "
            f"pyproject.toml: its fast statements use SQLAlchemy's private API), but "
            f"SQLAlchemy {installed} is installed; install SQLAlchemy=={SUPPORTED_SQLALCHEMY}"
        )


check_version(sqlalchemy.__version__)

Processor = Callable[[Any], Any]


@dataclass(frozen=True)
class CompiledStatement:
    """What a statement compiled into for one set of parameters, in the driver's terms."""

    sql: str
    # The driver's parameters in order (positional) or by name.
    names: list[str]
    positional: bool
    # Per IN list's parameter: the driver parameters it expanded into.
    expansion: dict[str, list[str]]
    # The values SQLAlchemy bound for the driver's parameters (constants among them).
    parameters: dict[str, Any]
    # Per driver parameter: its bind processor, if its type has one.
    processors: dict[str, Processor]
    # Per parameter of the statement: its type.
    bind_types: dict[str, TypeEngine[Any]]
    # Per result column: its name and type.
    result_columns: list[tuple[str, TypeEngine[Any]]]


def expanding_parameters(statement: Executable) -> frozenset[str]:
    """The names of the statement's IN lists' parameters."""
    return frozenset(
        element.key
        for element in iterate(statement)  # type: ignore[arg-type]
        if isinstance(element, BindParameter) and element.expanding
    )


def compile_statement(
    statement: Executable, dialect: Dialect, params: dict[str, Any]
) -> CompiledStatement | None:
    """``statement`` compiled for ``params`` (with psycopg: in PostgreSQL's own numbered
    parameters, for a ``RawCursor``); None when the driver alone cannot run it (Python-side
    defaults computed at execution, parameters rendered into the SQL, escaped names)."""
    compiled: Any = statement.compile(dialect=_compiling(dialect), column_keys=list(params))  # type: ignore[attr-defined]
    if (
        compiled.insert_prefetch
        or compiled.update_prefetch
        or compiled.literal_execute_params
        or compiled.escaped_bind_names
    ):
        return None
    state = compiled.construct_expanded_state(params)
    names = list(state.positiontup) if compiled.positional else list(state.parameters)
    # The expanded state has the processors of the IN lists' members only; the others'
    # (JSON, SQLite's datetimes) are the compiled statement's.
    processors = {
        name: process
        for name in names
        if (process := state.processors.get(name) or compiled._bind_processors.get(name))
        is not None
    }
    return CompiledStatement(
        sql=state.statement,
        names=names,
        positional=bool(compiled.positional),
        expansion={name: list(expanded) for name, expanded in state.parameter_expansion.items()},
        parameters=dict(state.parameters),
        processors=processors,
        bind_types={name: bind.type for name, bind in compiled.binds.items()},
        result_columns=[(entry[0], entry[3]) for entry in compiled._result_columns],
    )


def _compiling(dialect: Dialect) -> Dialect:
    """The dialect to compile with: psycopg's with PostgreSQL's own numbered parameters
    (the same dialect otherwise)."""
    if dialect.driver != "psycopg":
        return dialect
    numbered = copy.copy(dialect)
    numbered.paramstyle, numbered.positional = "numeric_dollar", True
    return numbered


def result_processor(kind: TypeEngine[Any], dialect: Dialect, coltype: Any) -> Processor | None:
    """The processor SQLAlchemy applies to a result column of ``kind`` (cached per dialect)."""
    return kind._cached_result_processor(dialect, coltype)


def cursor_execute(connection: Connection, cursor: Any, sql: str, parameters: Any) -> None:
    """``sql`` on the driver's ``cursor``, as SQLAlchemy runs a statement: the statement
    events fire, echo logs it, and a driver error comes as SQLAlchemy's (a lost
    connection invalidated)."""
    connection._cursor_execute(cursor, sql, parameters)


def cursor_executemany(connection: Connection, cursor: Any, sql: str, rows: Sequence[Any]) -> None:
    """``sql`` once per row, in the driver's ``executemany``, as ``cursor_execute``."""
    events = connection._has_events or connection.engine._has_events
    try:
        if events:
            connection.dispatch.before_cursor_execute(connection, cursor, sql, rows, None, True)
        connection.dialect.do_executemany(cursor, sql, rows, None)
        if events:
            connection.dispatch.after_cursor_execute(connection, cursor, sql, rows, None, True)
    except BaseException as exc:
        raise_as_sqlalchemys(connection, exc, sql, rows, cursor)


def raise_as_sqlalchemys(
    connection: Connection, exc: BaseException, sql: str, parameters: Any, cursor: Any
) -> NoReturn:
    """A driver error raised as SQLAlchemy wraps it (a lost connection invalidated)."""
    connection._handle_dbapi_exception(exc, sql, parameters, cursor, None)
    raise AssertionError("SQLAlchemy returned from raising a driver error")  # pragma: no cover
