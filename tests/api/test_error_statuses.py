"""Domain errors know nothing of HTTP; the API's one table gives each its status, the most
specific class first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from loadmaster import errors
from loadmaster.api import create_app
from loadmaster.api.errors import STATUS_OF, Forbidden, HttpError, status_of
from loadmaster.microversions import CLIENT_HEADERS


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


@pytest.mark.parametrize(
    ("path", "body", "detail"),
    [
        (
            "/flavors",
            {"name": "f", "resources": {"VCPU": -1}},
            "resources.VCPU: must be at least 0, got -1",
        ),
        (
            "/flavors",
            {"name": "f", "resources": {"VCPU": "a"}},
            "resources.VCPU: must be a whole number, got 'a'",
        ),
        ("/flavors", {"name": "f", "resources": {}, "colour": 1}, "colour: is not a field"),
        ("/flavors", {"resources": {}}, "name: is required"),
        (
            "/flavors",
            {"name": "n" * 300, "resources": {}},
            f"name: String should have at most 255 characters, got '{'n' * 56}...",
        ),
        (
            "/hosts",
            {"name": "h", "inventories": {"VCPU": {"total": -1}}},
            "inventories.VCPU.total: must be at least 1, got -1",
        ),
    ],
)
def test_loadmasters_routes_name_the_field_and_the_reason_once(
    tmp_path: Path, path: str, body: dict[str, Any], detail: str
) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'errors.db'}", None)
    with TestClient(app) as client:
        refused = client.post(path, json=body)
    assert refused.status_code == 400
    assert refused.json()["detail"] == detail
    assert refused.json()["errors"][0]["detail"] == detail


def test_placements_routes_keep_its_schema_words(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'errors.db'}", None)
    with TestClient(app) as client:
        refused = client.post("/resource_providers", json={"name": "h", "colour": 1})
        inventory = client.post(
            "/resource_classes", json={"name": "CUSTOM_" + "X" * 300}, headers=CLIENT_HEADERS
        )
    assert refused.json()["detail"].startswith(
        "JSON does not validate: unknown field: Additional properties are not allowed"
    )
    assert (
        "Failed validating 'maxLength' in schema['properties']['name']"
        in (inventory.json()["detail"])
    )
