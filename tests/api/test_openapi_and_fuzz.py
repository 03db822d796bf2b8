"""The OpenAPI document, and a schemathesis fuzz run from it that must find no 5xx and\nno refused request that changed anything."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from api_helpers import table_rows
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

import loadmaster
from loadmaster.api import AuthConfig, create_app
from loadmaster.service import Loadmaster

TOKEN = "fuzz-admin-token"


def _document(tmp_path: Path) -> dict[str, Any]:
    app = create_app(f"sqlite:///{tmp_path / 'doc.db'}", AuthConfig({TOKEN: "admin"}))
    with TestClient(app) as client:
        response = client.get("/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def test_openapi_document_describes_the_api(tmp_path: Path) -> None:
    doc = _document(tmp_path)
    paths = doc["paths"]
    for path in (
        "/resource_classes",
        "/resource_providers/{provider}/inventories",
        "/resource_providers/{provider}/traits",
        "/resource_providers/{provider}/aggregates",
        "/resource_providers/{provider}/usages",
        "/traits",
        "/allocations/{consumer_uuid}",
        "/usages",
        "/flavors",
        "/vms",
        "/vms/{uuid}/start",
        "/vms/{uuid}/up",
        "/vms/{uuid}/stop",
        "/vms/{uuid}/migrate",
        "/server_groups",
        "/schedule",
        "/capacity",
        "/hosts/{host_name}/report",
        "/healthz",
        "/metrics",
    ):
        assert path in paths, path
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["security"] == [{"bearer": []}]
    assert paths["/healthz"]["get"]["security"] == []
    error = {"$ref": "#/components/schemas/ErrorBody"}
    for path, operations in paths.items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)  # invalid input is a 400 here
            assert responses["4XX"]["content"]["application/json"]["schema"] == error
    schemas = doc["components"]["schemas"]
    bodies = ("FlavorCreate", "ProviderCreate", "Inventory", "ScheduleIn", "HostReport")
    for body in (*bodies, "RequestSpec", "VmSpec", "InventoryPut", "InventoryPost"):
        assert schemas[body]["additionalProperties"] is False, body
    assert set(schemas["ErrorBody"]["required"]) == {"code", "title", "detail", "errors"}


def test_every_json_answer_has_a_typed_schema(tmp_path: Path) -> None:
    """Each 2xx JSON answer names a model (api/responses.py), not a bare object: the
    document describes what every route answers, and the fuzz run checks answers
    against it."""
    untyped = []
    answers = 0
    for path, operations in _document(tmp_path)["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                content = response.get("content", {}).get("application/json")
                if not status.startswith("2") or content is None:
                    continue
                answers += 1
                if "$ref" not in content["schema"]:
                    untyped.append(f"{method.upper()} {path} {status}")
    assert untyped == [] and answers >= 60


def _fuzz_service() -> Loadmaster:
    """A small catalogue named "0", the name generated data tries first, so that requests
    reach past "not found" into the handlers."""
    directory = Path(tempfile.mkdtemp(prefix="loadmaster-fuzz-"))
    lm = loadmaster.open(f"sqlite:///{directory / 'fuzz.db'}")
    lm.hosts.create("0", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}})
    lm.flavors.create({"name": "0", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    lm.groups.create("0", "anti-affinity")
    return lm


FUZZED = _fuzz_service()
# Without tokens: with them the document declares an Authorization header, which
# schemathesis mutates into "invalid" requests that the valid token the test must add
# turns valid again. Tokens and roles are walked in test_access_walk.py.
FUZZED_APP = create_app(FUZZED, None)
# Agents' liveness is written in bulk in the background (HostWatch), not by the request
# heard: a flush landing between two snapshots would read as a refused request's write.
FUZZED_APP.state.watch.flush_s = 1e9
schema = schemathesis.openapi.from_asgi("/openapi.json", FUZZED_APP)


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=True,  # the same examples every run: a failure here is never flaky
)
def test_fuzz_finds_no_server_errors(case: Any) -> None:
    """Every check schemathesis has (no 5xx, documented status codes, response schemas,
    invalid data refused, Allow headers...) except one: schema-valid data may still break
    a domain rule (a trait name in lower case, a class that does not exist) and get 400."""
    before = table_rows(FUZZED)
    response = case.call_and_validate(excluded_checks=[positive_data_acceptance])
    if response.status_code >= 400:
        assert table_rows(FUZZED) == before, f"{case.method} {case.path} refused but wrote"
