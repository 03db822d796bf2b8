"""Durable state: SQLAlchemy tables, migrations and transactions (SQLite or PostgreSQL)."""

from loadmaster.store import schema
from loadmaster.store.engine import ClockNotices, Store, WriteConflict, again_on_write_conflict

__all__ = ["ClockNotices", "Store", "WriteConflict", "again_on_write_conflict", "schema"]
