"""Database failures reach callers as domain errors whose text a client may see: no SQL,
no parameters, no process ids. The driver's text goes to the log."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from loadmaster.api.errors import status_of
from loadmaster.errors import (
    ConcurrentUpdate,
    Conflict,
    LoadmasterError,
    StoreUnavailable,
    ValidationError,
)
from loadmaster.service import Loadmaster

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
