"""Connecting to the database: SQLite (embedded default) or PostgreSQL, same code.

Write transactions on SQLite start with ``BEGIN IMMEDIATE`` so two writers never both
read a snapshot and then race to upgrade it (that fails late, as SQLITE_BUSY, instead
of waiting). The writers of one process also take turns on a lock of their own before
it: SQLite's busy handler sleeps a blocked writer in growing steps, so a write arriving
while claims hold the database back to back waited up to the longest step past their end
(the slowest ``POST /vms`` with placing clients several times the median); on the lock
it wakes as the last writer commits. PostgreSQL runs at READ COMMITTED; the
host generation compare-and-swap in ``pending`` is what keeps concurrent claims honest
there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from loadmaster.errors import ConcurrentUpdate, Conflict, StoreUnavailable, ValidationError
from loadmaster.store.checkpoints import Checkpointer
from loadmaster.store.driver import PLAIN_STATEMENTS
from loadmaster.store.history import record_vm_events
from loadmaster.store.locking import CHANGED_HOSTS, CLOCK_CHANNEL
from loadmaster.store.schema import Base
from loadmaster.store.sqlalchemy_internals import cursor_execute
from loadmaster.store.transaction import CoreTransaction, Transaction

log = logging.getLogger("loadmaster.store")

# How long a SQLite writer waits for its turn, on the process's lock or in SQLite.
_SQLITE_BUSY_S = 30
# PostgreSQL SQLSTATEs of a transaction that lost to another one and wrote nothing.
_LOST_TO_ANOTHER = {"40P01": "deadlock", "40001": "serialization failure", "55P03": "lock timeout"}
_MIGRATIONS = Path(__file__).parent / "migrations"
_SQLITE_BEGIN = "loadmaster_sqlite_begin"
ChangeListener = Callable[[frozenset[int]], None]


def _is_file(url: str) -> bool:
    return ":memory:" not in url and url not in ("sqlite://", "sqlite+pysqlite://")


def _sqlite_engine(url: str, options: dict[str, Any]) -> Engine:
    engine = create_engine(
        url,
        connect_args={"timeout": _SQLITE_BUSY_S, "check_same_thread": False},
        execution_options=options,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from pysqlite so BEGIN IMMEDIATE is ours to emit.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if _is_file(url):
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            # The store's ``Checkpointer`` folds the log back, outside every writer's turn.
            cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_S * 1000}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # On the driver's cursor, as ``store/driver.py`` runs the hot statements: through
        # ``exec_driver_sql`` the BEGIN of every transaction cost a full execution
        # context, a cost every placement paid. ``cursor_execute`` still fires the
        # statement events and wraps the driver's errors (a busy database).
        options = conn.get_execution_options()
        mode = options.get(_SQLITE_BEGIN, "DEFERRED")
        if options.get(PLAIN_STATEMENTS):
            conn.exec_driver_sql(f"BEGIN {mode}")
            return
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            cursor_execute(conn, cursor, f"BEGIN {mode}", ())
        finally:
            cursor.close()

    return engine


class ClockNotices:
    """LISTEN on the clock's channel, on a connection of its own (autocommit: a LISTEN
    takes effect when its transaction commits, and an open transaction would hold back
    the notices). Used from one thread."""

    def __init__(self, url: str) -> None:
        self._conninfo = make_url(url).set(drivername="postgresql").render_as_string(False)
        self._connection: psycopg.Connection[Any] | None = None

    def wait(self, timeout: float) -> bool:
        """Whether a notice came within ``timeout`` s; the ones queued behind it are taken
        with it. Raises when the database cannot be reached (and connects again next)."""
        try:
            if self._connection is None:
                self._connection = psycopg.connect(self._conninfo, autocommit=True)
                self._connection.execute(f"LISTEN {CLOCK_CHANNEL}")
            got = any(True for _ in self._connection.notifies(timeout=timeout, stop_after=1))
            if got:
                for _ in self._connection.notifies(timeout=0):
                    pass
            return got
        except psycopg.Error:
            self.close()
            raise

    def close(self) -> None:
        if self._connection is not None:
            with suppress(psycopg.Error):
                self._connection.close()
            self._connection = None


# A pooled PostgreSQL connection unused for this long is pinged before it is handed out
# (a server restart or a failover ends connections without a word); one used more recently
# is not. SQLAlchemy's pool_pre_ping pinged on every checkout: a round trip per
# transaction, two per placement, a good share of the scheduling process's time.
# A connection that broke in the last second was in use when it broke, so the pool was
# already told (a disconnect invalidates every pooled connection).
IDLE_PING_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection: Any, record: Any) -> None:
        record.info["returned_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _check(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get("returned_at")
        if returned is not None and time.monotonic() - returned < IDLE_PING_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError(str(exc)) from exc
        if not alive:
            raise DisconnectionError("the connection did not answer a ping")


class Store:
    """The database behind every service: sessions for reading and for writing."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 5,
        pool_timeout: float = 30.0,
        fast_statements: bool = True,
    ) -> None:
        """``fast_statements`` False: every statement runs through SQLAlchemy's own
        execution, none on the driver's cursor (``store/driver.py``); the same results."""
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        options = {} if fast_statements else {PLAIN_STATEMENTS: True}
        if self.is_sqlite:
            self.engine = _sqlite_engine(url, options)
            self._write_engine: Engine = self.engine.execution_options(
                **{_SQLITE_BEGIN: "IMMEDIATE"}
            )
        else:
            self.engine = create_engine(
                url, pool_size=pool_size, pool_timeout=pool_timeout, execution_options=options
            )
            _ping_when_idle(self.engine)
            self._write_engine = self.engine
        # A read of several statements (the audit, a scheduler snapshot, a usage report) must
        # see one snapshot: under PostgreSQL's default READ COMMITTED a claim committing
        # between two statements shows a VM pending without its records. SQLite's read
        # transaction is already one snapshot. Read-only REPEATABLE READ never fails to commit.
        read_engine = (
            self.engine
            if self.is_sqlite
            else self.engine.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
        )
        self._read_engine = read_engine
        self._read_sessions = sessionmaker(read_engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self._write_engine, expire_on_commit=False)
        record_vm_events(self._write_sessions)
        # An in-memory SQLite database lives in one connection; serialise its users.
        self._memory_lock = threading.RLock() if ":memory:" in url or url == "sqlite://" else None
        # SQLite writers of this process queue here (see the module's docstring). Reentrant:
        # a write opened inside another (never done on purpose) meets SQLite's own lock,
        # as before, instead of waiting for itself.
        self._write_turn = threading.RLock() if self.is_sqlite else None
        self._listeners: list[ChangeListener] = []
        self._checkpointer = (
            Checkpointer(str(make_url(url).database)) if self.is_sqlite and _is_file(url) else None
        )

    def listen(self, listener: ChangeListener) -> Callable[[], None]:
        """Call ``listener(host_ids)`` after every write transaction of this process that
        stamped hosts on the cluster clock commits (in the committing thread, so it must be
        quick and thread-safe); returns the function that stops it. Other processes'
        changes are not seen here: the clock says which hosts they changed."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    @contextmanager
    def read(self, session: Session | None = None) -> Iterator[Session]:
        """A read transaction (one snapshot); given ``session``, a read the caller has
        open, that one, so several readers share one transaction."""
        if session is not None:
            yield session
            return
        with self._guard(), self._unavailable_as_503(), self._read_sessions() as session:
            yield session
            # Ended by COMMIT, not the ROLLBACK of closing: psycopg answers a ROLLBACK by
            # dropping every prepared statement of the connection (DEALLOCATE ALL, one more
            # round trip), and the writes' prepared statements went with them. Only
            # when the read changed nothing: an object altered in a read session is
            # discarded, as before.
            if not (session.new or session.dirty or session.deleted):
                session.commit()

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that commits on success and rolls back on any exception."""
        with (
            self._turn(),
            self._guard(),
            self._unavailable_as_503(),
            self._write_sessions.begin() as session,
        ):
            yield session
        self._committed(session.info)

    @contextmanager
    def transaction(self) -> Iterator[CoreTransaction]:
        """``write``'s transaction on a Core connection, for code that needs no ORM entity
        (``store/transaction.py``): the same turn, errors, events and listeners."""
        from loadmaster.store.history import write_events

        with (
            self._turn(),
            self._guard(),
            self._unavailable_as_503(),
            self._write_engine.connect() as connection,
            connection.begin(),
        ):
            transaction = CoreTransaction(connection)
            try:
                yield transaction
                write_events(transaction)
            finally:
                transaction.close()
        self._committed(transaction.info)

    @contextmanager
    def read_transaction(self, transaction: Transaction | None = None) -> Iterator[Transaction]:
        """``read``'s transaction on a Core connection (one snapshot, read-only on
        PostgreSQL), for the scheduler's reads; given ``transaction``, that one."""
        if transaction is not None:
            yield transaction
            return
        with (
            self._guard(),
            self._unavailable_as_503(),
            self._read_engine.connect() as connection,
        ):
            connection.begin()
            core = CoreTransaction(connection)
            try:
                yield core
            finally:
                core.close()
            connection.commit()  # not the ROLLBACK of closing: see ``read``

    def _committed(self, info: dict[Any, Any]) -> None:
        """After a write transaction commits."""
        if self._checkpointer is not None:
            self._checkpointer.wrote()
        changed = info.get(CHANGED_HOSTS)
        if changed:
            hosts = frozenset(changed)
            for listener in list(self._listeners):
                listener(hosts)

    def clock_notices(self) -> ClockNotices | None:
        """On PostgreSQL, a way to wait until a transaction of any process stamps hosts
        (``CLOCK_CHANNEL``); on SQLite, where only the clock can say, None."""
        return None if self.is_sqlite else ClockNotices(self.url)

    def refresh_statistics(self, *tables: type[Base]) -> None:
        """After a bulk load: PostgreSQL's ANALYZE of ``tables`` now, as after a restore,
        not when autovacuum next looks. SQLite's planner needs no statistics to use an
        index, so it is left alone."""
        if self.is_sqlite:
            return
        names = ", ".join(f'"{table.__tablename__}"' for table in tables)
        with self._unavailable_as_503(), self.engine.connect() as connection:
            connection.execute(text(f"ANALYZE {names}"))
            connection.commit()

    @contextmanager
    def _turn(self) -> Iterator[None]:
        """This process's turn to write (SQLite); as long a wait as SQLite's busy timeout."""
        if self._write_turn is None:
            yield
            return
        if not self._write_turn.acquire(timeout=_SQLITE_BUSY_S):
            raise StoreUnavailable(
                "the database stayed busy with other writes; nothing was written"
            )
        try:
            yield
        finally:
            self._write_turn.release()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        if self._memory_lock is None:
            yield
        else:
            with self._memory_lock:
                yield

    @contextmanager
    def _unavailable_as_503(self) -> Iterator[None]:
        """Database failures as domain errors whose text a client may see. The driver's own
        message (SQL, parameters, process ids, tuple positions) goes to the log only, where
        the request id of the JSON log line ties it to the client's answer."""
        try:
            yield
        except IntegrityError as exc:
            # A unique or foreign key the checks before the write could not see: another
            # transaction created or deleted the same thing meanwhile. Nothing was written.
            table = _diag(exc, "table_name")
            log.warning("integrity error on %s: %s", table or "?", exc.orig)
            if not _is_race(exc):  # a CHECK or NOT NULL: input the checks let through
                raise ValidationError(
                    "a value is outside what the database accepts; nothing was written"
                ) from exc
            raise WriteConflict(_integrity_detail(exc, table), table=table) from exc
        except DataError as exc:
            log.warning("value refused by the database: %s", exc.orig)
            raise ValidationError(
                "a value cannot be stored (out of range, or a NUL character)"
            ) from exc
        except OperationalError as exc:
            lost = _LOST_TO_ANOTHER.get(_sqlstate(exc) or "")
            if lost is not None:
                log.warning("%s: %s", lost, exc.orig)
                raise ConcurrentUpdate(
                    f"the transaction lost a {lost} against another writer; nothing was "
                    "written, retry"
                ) from exc
            if self.is_sqlite and "locked" not in str(exc):
                raise
            log.error("database unavailable: %s", exc.orig)
            raise StoreUnavailable("database unavailable; nothing was written") from exc
        except PoolTimeout as exc:
            # Every pooled connection stayed busy for pool_timeout: the service is
            # overloaded, which the client should hear as "try again", not as a bug.
            log.error("no database connection free: %s", exc)
            raise StoreUnavailable(
                "every database connection is busy; nothing was written, retry"
            ) from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                log.error("database connection lost: %s", exc.orig)
                raise StoreUnavailable("database connection lost; nothing was written") from exc
            raise

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to the newest migration (or to ``revision``); safe to call from
        many processes at once."""
        config = _alembic_config()
        with self.engine.connect() as connection:
            if not self.is_sqlite:
                # Several API workers start together; only one may run DDL at a time.
                connection.execute(text("SELECT pg_advisory_lock(7262001)"))
                connection.commit()
            try:
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
                connection.commit()
            finally:
                if not self.is_sqlite:
                    connection.execute(text("SELECT pg_advisory_unlock(7262001)"))
                    connection.commit()

    def revisions(self) -> tuple[str | None, str]:
        """The schema revision the database is at (None: never migrated) and the newest
        one this code knows."""
        head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
        assert head is not None  # the package ships its migrations
        with self.engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
        return current, head

    def dispose(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
        self.engine.dispose()


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


class WriteConflict(Conflict):
    """A constraint refused a write that raced another transaction (the same name created
    twice at once, a row deleted while another referred to it). Callers whose write is
    idempotent catch it and read again."""

    def __init__(self, detail: str, *, table: str | None = None) -> None:
        super().__init__(detail, field=None)
        self.table = table


T = TypeVar("T")


def again_on_write_conflict(write: Callable[[], T]) -> T:
    """Run an idempotent write; if it raced an identical one (``WriteConflict``), run it
    once more: the second run reads what the winner committed and answers from it (the
    same answer, or a Conflict naming the difference)."""
    try:
        return write()
    except WriteConflict:
        return write()


# Tables as a client knows them.
_NOUNS = {
    "hosts": "host",
    "traits": "trait",
    "resource_classes": "resource class",
    "flavors": "flavor",
    "server_groups": "server group",
    "vms": "VM",
    "allocations": "allocation",
    "inventories": "inventory",
}


def _is_race(exc: IntegrityError) -> bool:
    """A unique or foreign-key violation: what two racing transactions cause."""
    text = str(exc.orig)
    return _sqlstate(exc) in ("23505", "23503") or "UNIQUE" in text or "FOREIGN KEY" in text


def _integrity_detail(exc: IntegrityError, table: str | None) -> str:
    """What a client may read about a constraint that refused a racing write: which kind
    of race it lost, never the constraint's SQL or values."""
    text = str(exc.orig)
    what = f"the same {_NOUNS.get(table, table)}" if table else "the same thing"
    if _sqlstate(exc) == "23505" or "UNIQUE" in text:
        head = f"{what} was created by another request at the same moment"
    else:
        head = (
            "this refers to something another request deleted at the same moment, or "
            "something another request just made refer to it"
        )
    return f"{head}; nothing was written, read again and retry"


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)


def _diag(exc: DBAPIError, name: str) -> str | None:
    diag = getattr(exc.orig, "diag", None)
    value = getattr(diag, name, None) if diag is not None else None
    return value if isinstance(value, str) else None
