"""Durable state: SQLAlchemy tables, migrations and transactions (SQLite or PostgreSQL),
and the fast statement layer the hot paths run their statements through (``Prepared``
statements built at import, then ``run``, ``run_chunked``, ``run_many``, in a
``pipelined`` block on PostgreSQL)."""

from loadmaster.store import schema
from loadmaster.store.driver import Prepared, Rows, pipelined, run, run_chunked, run_many
from loadmaster.store.engine import ClockNotices, Store, WriteConflict, again_on_write_conflict

__all__ = [
    "ClockNotices",
    "Prepared",
    "Rows",
    "Store",
    "WriteConflict",
    "again_on_write_conflict",
    "pipelined",
    "run",
    "run_chunked",
    "run_many",
    "schema",
]
