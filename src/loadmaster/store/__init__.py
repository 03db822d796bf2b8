"""Durable state: SQLAlchemy tables, migrations and transactions (SQLite or PostgreSQL)."""

from loadmaster.store import schema
from loadmaster.store.engine import DEFAULT_URL, Store, WriteConflict, again_on_write_conflict

__all__ = ["DEFAULT_URL", "Store", "WriteConflict", "again_on_write_conflict", "schema"]
