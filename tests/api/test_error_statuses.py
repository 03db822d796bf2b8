"""Domain errors know nothing of HTTP; the API's one table gives each its status, the most
specific class first."""

from __future__ import annotations

import pytest

from loadmaster import errors
from loadmaster.api.errors import STATUS_OF, Forbidden, HttpError, status_of


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.ValidationError("x"), 400),
        (errors.NotFound("x"), 404),
        (errors.Conflict("x"), 409),
        (errors.ConcurrentUpdate("x"), 409),
        (errors.InsufficientCapacity("x"), 409),
        (errors.NoValidHost("x"), 409),
        (errors.StoreUnavailable("x"), 503),
        (errors.PluginFailed("x"), 500),
        (Forbidden("x"), 403),
        (HttpError("x", 418), 418),
    ],
)
def test_each_error_has_its_status(error: errors.LoadmasterError, status: int) -> None:
    assert status_of(error) == status


def test_no_domain_error_carries_an_http_status() -> None:
    domain = [
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.LoadmasterError)
    ]
    assert domain and not any("status" in vars(cls) for cls in domain)


def test_the_table_puts_every_subclass_before_its_base() -> None:
    kinds = [kind for kind, _ in STATUS_OF]
    for i, kind in enumerate(kinds):
        assert not any(issubclass(later, kind) and later is not kind for later in kinds[i + 1 :])
