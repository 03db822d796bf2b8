"""The placement path answered directly (``api/direct.py``) answers as the middleware
stack does: the same requests, sent to an app with the direct path and to one without
(over identical databases), get the same statuses, bodies and headers, refusals and
errors included; and the direct path counts, logs and labels what it answers."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import build_cluster, ok
from fastapi.testclient import TestClient

import loadmaster
from loadmaster.api import AuthConfig, create_app
from loadmaster.api.direct import HOT_PATHS
from loadmaster.microversions import CLIENT_HEADERS

ADMIN, READER, MEMBER, AGENT = "adm-tok", "rdr-tok", "mbr-tok", "agt-tok"
TOKENS = {ADMIN: "admin", READER: "reader", MEMBER: "member", AGENT: "agent:h0"}
MAX_BODY = 4096
# Fields that differ between two runs of the same request: times, random draws, ids.
VARYING = {"seed", "seconds", "decision_seconds", "created_at", "updated_at", "request_id", "mac"}
COMPARED_HEADERS = (
    "content-type",
    "openstack-api-version",
    "vary",
    "cache-control",
    "www-authenticate",
    "allow",
    "retry-after",
)
VM_A = str(uuid.UUID(int=1))
VM_B = str(uuid.UUID(int=2))
VM_C = str(uuid.UUID(int=3))
NEW_VM = json.dumps({"name": "c", "flavor": "small", "uuid": VM_C}).encode()


def _client(tmp_path: Path, name: str, direct: bool) -> TestClient:
    lm = loadmaster.open(f"sqlite:///{tmp_path / name}.db")
    app = create_app(lm, AuthConfig(TOKENS), max_body_size=MAX_BODY)
    app.direct.enabled = direct  # type: ignore[attr-defined]
    client = TestClient(app, headers={**CLIENT_HEADERS, "Authorization": f"Bearer {ADMIN}"})
    client.__enter__()
    # One host: every placement has one possible answer, so both apps choose alike.
    build_cluster(client, hosts=1)
    for vm, name in ((VM_A, "a"), (VM_B, "b")):
        ok(client.post("/vms", json={"name": name, "flavor": "small", "uuid": vm}), 201)
    return client


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[TestClient, TestClient]]:
    direct, stack = _client(tmp_path, "direct", True), _client(tmp_path, "stack", False)
    try:
        yield direct, stack
    finally:
        for client in (direct, stack):
            client.__exit__(None, None, None)
            client.app.state.lm.close()  # type: ignore[attr-defined]


def _scrub(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: "*" if k in VARYING else _scrub(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_scrub(v) for v in data]
    return data


def _outcome(response: httpx.Response) -> tuple[Any, ...]:
    try:
        body: Any = _scrub(response.json())
    except ValueError:
        body = response.text
    headers = {name: response.headers.get(name) for name in COMPARED_HEADERS}
    if "last-modified" in response.headers:
        headers["last-modified"] = "present"
    ids = {response.headers.get(n) for n in ("x-request-id", "openstack-request-id")}
    return response.status_code, body, headers, len(ids) == 1 and None not in ids


# (method, path, extra headers, body bytes or None), sent as JSON unless the extra headers
# say otherwise (an empty Content-Type: none); in order, each changes both databases alike.
REQUESTS: list[tuple[str, str, dict[str, str], bytes | None]] = [
    ("POST", "/schedule", {}, json.dumps({"requests": [{"vms": [VM_A]}]}).encode()),
    ("POST", "/schedule", {"Authorization": ""}, b'{"requests": [{"vms": ["x"]}]}'),
    ("POST", "/schedule", {"Authorization": "Bearer nope"}, b'{"requests": [{"vms": ["x"]}]}'),
    ("POST", "/schedule", {"Authorization": f"Bearer {READER}"}, b'{"requests": []}'),
    ("POST", "/schedule", {"Authorization": f"Bearer {MEMBER}"}, b'{"requests": []}'),
    ("POST", "/schedule", {"Authorization": f"Bearer {AGENT}"}, b'{"requests": []}'),
    ("POST", "/schedule", {"OpenStack-API-Version": "placement 1.x"}, b'{"requests": []}'),
    ("POST", "/schedule", {"OpenStack-API-Version": "placement 9.0"}, b'{"requests": []}'),
    ("POST", "/schedule", {"OpenStack-API-Version": "compute 2.1"}, b'{"requests": []}'),
    ("POST", "/schedule", {}, b'{"requests": [{"vms": ["'),
    ("POST", "/schedule", {}, b'{"requests": []}'),
    ("POST", "/schedule", {}, b'{"requests": [{"vms": ["x"]}], "nope": 1}'),
    ("POST", "/schedule", {}, b'{"requests": [{"vms": ["a\\u0000"]}]}'),
    ("POST", "/schedule", {}, b'{"requests": [{"vms": ["no-such-vm"]}]}'),
    ("POST", "/schedule", {}, b'{"requests": [{"vms": ["x"]}], "policy": "nope"}'),
    ("POST", "/schedule?dry=1", {}, b'{"requests": [{"vms": ["x"]}]}'),
    ("POST", "/schedule", {"Content-Type": "text/plain"}, b'{"requests": []}'),
    ("POST", "/schedule", {"Content-Type": ""}, b'{"requests": []}'),
    ("POST", "/schedule", {"Content-Type": ""}, None),
    ("POST", "/schedule", {}, None),
    ("POST", "/schedule", {"Accept": "text/html"}, b'{"requests": [{"vms": ["'),
    ("POST", "/schedule", {}, b'{"requests": [{"vms": ["' + b"x" * MAX_BODY + b'"]}]}'),
    # Deeper than Python's JSON parser goes (its recursion limit), within the body limit.
    ("POST", "/schedule", {}, b'{"requests": ' + b"[" * 1500 + b"]" * 1500 + b"}"),
    ("POST", "/vms", {}, NEW_VM),
    ("POST", "/vms", {}, NEW_VM),
    ("POST", "/vms", {}, json.dumps({"name": "c", "flavor": "small", "uuid": VM_A}).encode()),
    ("POST", "/vms", {}, json.dumps({"name": "c", "flavor": "gpu", "uuid": VM_A}).encode()),
    ("POST", "/vms", {}, b'{"name": "d", "flavor": "no-such-flavor"}'),
    ("POST", "/vms", {}, b'{"name": "d", "flavor": 3}'),
    ("POST", "/vms", {"Authorization": f"Bearer {READER}"}, b'{"name": "d", "flavor": "small"}'),
    ("POST", f"/vms/{VM_B}/start", {}, b'{"host": "no-such-host"}'),
    ("POST", f"/vms/{VM_B}/start", {}, b'{"host": "h0", "nope": 1}'),
    ("POST", f"/vms/{VM_B}/start", {}, b"null"),
    ("POST", f"/vms/{VM_B}/start", {}, None),
    ("POST", f"/vms/{VM_A}/start", {}, None),
    ("POST", "/vms/no-such-vm/start", {}, b"{}"),
    ("POST", "/vms/no-such-vm/start", {"Accept": "text/html"}, b"{}"),
    ("POST", "/vms/a%00b/start", {}, None),
    ("POST", f"/vms/{VM_B}/start?host=h0", {}, None),
    ("POST", f"/vms/{VM_B}/start", {"Authorization": f"Bearer {AGENT}"}, None),
    ("POST", f"/vms/{VM_B}/stop", {}, None),
    ("POST", f"/vms/{VM_B}/start", {}, b'{"host": "h0"}'),
]

# Each request's status, and whether the direct path answered it (else the stack did).
EXPECTED = [
    (200, True),
    (401, False),
    (401, False),
    (403, False),
    (403, False),
    (403, False),
    (400, False),
    (406, False),
    (400, False),
    (400, False),
    (400, False),
    (400, False),
    (400, False),
    (404, True),
    (400, True),
    (400, False),
    (415, False),
    (400, False),
    (415, False),
    (415, False),
    (400, False),
    (413, False),
    (400, False),
    (201, True),
    (201, True),
    (409, True),
    (409, True),
    (404, True),
    (400, False),
    (403, False),
    (404, True),
    (400, False),
    (200, True),
    (409, True),
    (409, True),
    (404, True),
    (404, False),
    (400, False),
    (400, False),
    (403, False),
    (200, False),
    (200, True),
]


def test_the_direct_path_answers_as_the_stack_does(
    pair: tuple[TestClient, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    direct, stack = pair
    routes = direct.app.direct  # type: ignore[attr-defined]
    served: list[str] = []
    serve = routes._serve

    async def counted(*args: Any) -> None:
        served.append(args[1]["path"])
        await serve(*args)

    monkeypatch.setattr(routes, "_serve", counted)
    statuses = []
    for method, path, extra, body in REQUESTS:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        headers.update(extra)
        if not headers.get("Content-Type", True):
            del headers["Content-Type"]
        sent = [
            client.request(method, path, headers=headers, content=body)
            for client in (direct, stack)
        ]
        assert _outcome(sent[0]) == _outcome(sent[1]), (method, path, extra, body)
        statuses.append(sent[0].status_code)
    # Answered directly: the happy ones and the domain's own refusals; the rest by the stack.
    assert statuses == [s for s, _ in EXPECTED]
    assert served == [
        path for (_, direct), (_, path, _, _) in zip(EXPECTED, REQUESTS, strict=True) if direct
    ]
    # Both databases went the same way: the same VMs in the same states, on the same host.
    states = [
        sorted((v["name"], v["state"], v["host"]) for v in ok(client.get("/vms"))["vms"])
        for client in (direct, stack)
    ]
    assert states[0] == states[1]
    assert states[0] == [("a", "pending", "h0"), ("b", "pending", "h0"), ("c", "requested", None)]


def test_every_hot_path_is_answered_directly(tmp_path: Path) -> None:
    app = create_app(loadmaster.open(f"sqlite:///{tmp_path / 'x.db'}"))
    served = {(r.method, r.route.path) for r in app.direct.routes}  # type: ignore[attr-defined]
    assert served == set(HOT_PATHS)
    app.state.lm.close()


def test_a_direct_answer_is_labelled_counted_and_logged(
    pair: tuple[TestClient, TestClient], caplog: pytest.LogCaptureFixture
) -> None:
    direct, _ = pair
    with caplog.at_level(logging.INFO, logger="loadmaster.api.access"):
        answer = direct.post(
            "/schedule",
            json={"requests": [{"vms": [VM_A]}]},
            headers={"X-Request-ID": "req-given-1"},
        )
        missing = direct.post("/vms/no-such-vm/start")
    assert ok(answer)["placed"] == 1
    assert answer.headers["openstack-api-version"] == "placement 1.39"
    assert answer.headers["cache-control"] == "no-cache"
    for name in ("x-request-id", "openstack-request-id", "x-openstack-request-id"):
        assert answer.headers[name] == "req-given-1"
    # A domain error in both shapes, its Placement entry carrying the request id.
    error = missing.json()
    assert missing.status_code == 404 and error["code"] == "loadmaster.not_found"
    assert error["errors"][0]["request_id"] == missing.headers["x-request-id"]
    assert error["errors"][0]["code"] == "placement.undefined_code"
    logged = [r.fields for r in caplog.records if r.name == "loadmaster.api.access"]  # type: ignore[attr-defined]
    assert {(f["route"], f["status"]) for f in logged} >= {
        ("/schedule", 200),
        ("/vms/{uuid}/start", 404),
    }
    metrics = direct.get("/metrics").text
    assert 'route="/schedule",status="200"' in metrics
    assert (
        'loadmaster_http_requests_total{method="POST",route="/vms/{uuid}/start",status="404"}'
        in (metrics)
    )
    assert 'loadmaster_placements_total{outcome="placed"}' in metrics


def test_an_unexpected_error_is_a_500_in_the_error_shape(
    pair: tuple[TestClient, TestClient],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    direct, _ = pair

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(direct.app.state.lm.scheduler, "schedule", broken)  # type: ignore[attr-defined]
    with caplog.at_level(logging.ERROR, logger="loadmaster.api"):
        answer = direct.post("/schedule", json={"requests": [{"vms": [VM_A]}]})
    assert answer.status_code == 500
    body = answer.json()
    assert body["code"] == "loadmaster.internal" and "boom" not in answer.text
    assert body["errors"][0]["status"] == 500
    assert answer.headers["openstack-api-version"] == "placement 1.39"
    assert any("unhandled error on POST /schedule" in r.getMessage() for r in caplog.records)
    # The server still answers.
    assert direct.get("/healthz").status_code == 200


def test_the_direct_routes_stay_documented(pair: tuple[TestClient, TestClient]) -> None:
    paths = ok(pair[0].get("/openapi.json"))["paths"]
    schedule = paths["/schedule"]["post"]
    assert schedule["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ScheduleIn"
    }
    assert "ScheduleOut" in json.dumps(schedule["responses"]["200"])
    assert "VmOut" in json.dumps(paths["/vms"]["post"]["responses"]["201"])
    assert "ScheduledVm" in json.dumps(paths["/vms/{uuid}/start"]["post"]["responses"]["200"])
