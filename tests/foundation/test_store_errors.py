"""Database failures reach callers as domain errors whose text a client may see: no SQL,
no parameters, no process ids. The driver's text goes to the log."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from loadmaster.api.errors import status_of
from loadmaster.errors import (
    ConcurrentUpdate,
    Conflict,
    LoadmasterError,
    StoreUnavailable,
    ValidationError,
)
from loadmaster.service import Loadmaster
from loadmaster.store import Store

SECRET = "UPDATE hosts SET generation=... Process 4242 waits for ShareLock; tuple (0,7)"


class _Driver(Exception):
    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("error", "kind", "status"),
    [
        (OperationalError(SECRET, {}, _Driver(SECRET, "40P01")), ConcurrentUpdate, 409),
        (OperationalError(SECRET, {}, _Driver(SECRET, "40001")), ConcurrentUpdate, 409),
        (IntegrityError(SECRET, {}, _Driver(SECRET, "23505")), Conflict, 409),
        (IntegrityError(SECRET, {}, _Driver(SECRET, "23503")), Conflict, 409),
        (IntegrityError(SECRET, {}, _Driver(SECRET, "23514")), ValidationError, 400),
        (
            DBAPIError(SECRET, {}, _Driver(SECRET), connection_invalidated=True),
            StoreUnavailable,
            503,
        ),
        (PoolTimeout(SECRET), StoreUnavailable, 503),
    ],
)
def test_store_errors_show_no_internals(
    lm: Loadmaster,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
    kind: type[LoadmasterError],
    status: int,
) -> None:
    with (
        caplog.at_level(logging.WARNING, "loadmaster.store"),
        pytest.raises(kind) as raised,
        lm.store.write(),
    ):
        raise error
    assert status_of(raised.value) == status
    for secret in ("UPDATE", "4242", "tuple", "ShareLock"):
        assert secret not in raised.value.detail
    assert "4242" in caplog.text  # the details are logged for the operator


@pytest.mark.postgres
def test_every_connection_busy_is_503_not_500(pg_url: str) -> None:
    """A server whose every pooled connection stays busy (100,000 hosts listed by slow
    requests piling up did it) answers "retry", and serves again once they are free."""
    store = Store(pg_url, pool_size=1, pool_timeout=0.2)
    held = [store.read() for _ in range(11)]  # the pool's 1, and its 10 of overflow
    try:
        for session in held:
            session.__enter__().execute(text("SELECT 1"))
        with pytest.raises(StoreUnavailable) as busy, store.read() as session:
            session.execute(text("SELECT 1"))
        assert status_of(busy.value) == 503 and "busy" in busy.value.detail
    finally:
        for session in held:
            session.__exit__(None, None, None)
    with store.read() as session:
        assert session.execute(text("SELECT 1")).scalar_one() == 1
    store.engine.dispose()
