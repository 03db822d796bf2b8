"""The placement path answered directly (``api/direct.py``) answers as the full stack
does: the same requests, sent to an app with the direct path and to one without (over
identical databases), get the same statuses and bodies, every response header (names,
and values but for those that differ between any two requests, compared by shape) and
the same log records with the same fields, refusals and errors included. Both are one
pipeline (``api/pipeline.py``): a stage added to it shows on both."""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import build_cluster, ok
from fastapi import FastAPI, Response
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import loadmaster
from loadmaster.api import AuthConfig, create_app, pipeline
from loadmaster.api.direct import HOT_PATHS, THREAD_PREFIX, DirectRoutes
from loadmaster.api.observability import JsonFormatter
from loadmaster.heartbeat import AGENT_RUN_HEADER
from loadmaster.microversions import CLIENT_HEADERS

ADMIN, READER, MEMBER, AGENT = "adm-tok", "rdr-tok", "mbr-tok", "agt-tok"
TOKENS = {ADMIN: "admin", READER: "reader", MEMBER: "member", AGENT: "agent:h0"}
MAX_BODY = 4096
# Fields that differ between two runs of the same request: times, random draws, ids.
VARYING = {"seed", "seconds", "decision_seconds", "created_at", "updated_at", "request_id", "mac"}
REQUEST_ID_HEADERS = ("x-request-id", "openstack-request-id", "x-openstack-request-id")
_GENERATED_ID = re.compile(r"^req-[0-9a-f-]{36}$")
VM_A = str(uuid.UUID(int=1))
VM_B = str(uuid.UUID(int=2))
VM_C = str(uuid.UUID(int=3))
NEW_VM = json.dumps({"name": "c", "flavor": "small", "uuid": VM_C}).encode()
MEASURED = json.dumps({"usage": {"VCPU": 2}, "load": {"cpu": 0.25}}).encode()
# Starting both: nothing the report says ends a claim.
FULL_REPORT = json.dumps({"running_vms": [], "launching": [VM_A, VM_B]}).encode()


def _direct_routes(client: TestClient) -> DirectRoutes:
    routes: DirectRoutes = client.app.state.direct  # type: ignore[attr-defined]
    return routes


def _client(tmp_path: Path, name: str, direct: bool) -> TestClient:
    lm = loadmaster.open(f"sqlite:///{tmp_path / name}.db")
    app = create_app(lm, AuthConfig(TOKENS), max_body_size=MAX_BODY)
    app.state.direct.enabled = direct
    client = TestClient(app, headers={**CLIENT_HEADERS, "Authorization": f"Bearer {ADMIN}"})
    client.__enter__()
    # One host: every placement has one possible answer, so both apps choose alike.
    build_cluster(client, hosts=1)
    for vm, name in ((VM_A, "a"), (VM_B, "b")):
        ok(client.post("/vms", json={"name": name, "flavor": "small", "uuid": vm}), 201)
    return client


def _close(*clients: TestClient) -> None:
    for client in clients:
        client.__exit__(None, None, None)
        client.app.state.lm.close()  # type: ignore[attr-defined]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[TestClient, TestClient]]:
    direct, stack = _client(tmp_path, "direct", True), _client(tmp_path, "stack", False)
    try:
        yield direct, stack
    finally:
        _close(direct, stack)


def _scrub(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: "*" if k in VARYING else _scrub(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_scrub(v) for v in data]
    return data


def _headers(response: httpx.Response) -> list[tuple[str, str]]:
    """Every header, in order; the values that differ between two answers to the same
    request by their shape: the request id (one value under each of its names), the
    time of the answer, the body's length (its varying fields vary it)."""
    ids = {response.headers.get(name) for name in REQUEST_ID_HEADERS}
    assert len(ids) == 1, ids
    (request_id,) = ids
    assert request_id is not None and _GENERATED_ID.match(request_id), request_id
    shown = []
    for name, value in response.headers.multi_items():
        if name in REQUEST_ID_HEADERS:
            value = "<request id>"
        elif name in ("date", "last-modified"):
            assert parsedate_to_datetime(value).tzinfo is not None, value
            value = "<http date>"
        elif name == "content-length":
            assert int(value) == len(response.content)
            value = "<length>"
        shown.append((name, value))
    return shown


class _Records(logging.Handler):
    """loadmaster's log records, each as its JSON line's fields, formatted when written
    (the request id is then in context)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))

    def taken(self, request_id: str) -> list[dict[str, Any]]:
        """The lines written since the last call, their varying values by shape."""
        taken, self.lines = self.lines, []
        for line in taken:
            assert line.pop("request_id") == request_id, line
            line["time"] = "<time>"
            if "ms" in line:
                assert line["ms"] >= 0
                line["ms"] = "<ms>"
            if "error" in line:
                line["error"] = line["error"].splitlines()[-1]
        return taken


def _outcome(response: httpx.Response, records: _Records) -> tuple[Any, ...]:
    try:
        body: Any = _scrub(response.json())
    except ValueError:
        body = response.text
    logged = records.taken(response.headers["x-request-id"])
    return response.status_code, body, _headers(response), logged


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
    ("POST", "/hosts/h0/report", {}, MEASURED),
    ("POST", "/hosts/h0/report", {"Authorization": f"Bearer {AGENT}"}, MEASURED),
    ("POST", "/hosts/h0/report", {AGENT_RUN_HEADER: "not a run"}, MEASURED),
    ("POST", "/hosts/h1/report", {"Authorization": f"Bearer {AGENT}"}, MEASURED),
    ("POST", "/hosts/no-such-host/report", {}, MEASURED),
    ("POST", "/hosts/h0/report", {}, b'{"load": {"cpu": 1.5}}'),
    ("POST", "/hosts/h0/report", {}, FULL_REPORT),
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
    # A browser's: the stack's HTML page of the direct answer.
    (404, True),
    (400, False),
    (400, False),
    (403, False),
    (200, False),
    (200, True),
    (200, True),
    (200, True),
    (400, True),
    (403, False),
    (404, True),
    (400, False),
    (200, True),
]


def _template(path: str) -> str:
    if path.endswith("/report"):
        return "/hosts/{host_name}/report"
    return "/vms/{uuid}/start" if path.endswith("/start") else path


def _counting(
    answer: Callable[[dict[str, Any]], Response], template: str, served: list[str]
) -> Callable[[dict[str, Any]], Response]:
    def counted(kwargs: dict[str, Any]) -> Response:
        served.append(template)
        return answer(kwargs)

    return counted


def _drive(
    direct: TestClient, stack: TestClient, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[Any, ...]]:
    """Each of ``REQUESTS`` sent to both, which answer and log alike; the outcomes.
    Checks which requests the direct path answered itself."""
    served: list[str] = []
    for route in _direct_routes(direct).routes:
        monkeypatch.setattr(route, "answer", _counting(route.answer, route.route.path, served))
    records = _Records()
    logger = logging.getLogger("loadmaster")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)
    outcomes = []
    try:
        for method, path, extra, body in REQUESTS:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            headers.update(extra)
            if not headers.get("Content-Type", True):
                del headers["Content-Type"]
            sent = [
                _outcome(client.request(method, path, headers=headers, content=body), records)
                for client in (direct, stack)
            ]
            assert sent[0] == sent[1], (method, path, extra, body)
            # Every answer is logged once, with its route's template and its status.
            access = [r for r in sent[0][3] if r["logger"] == "loadmaster.api.access"]
            assert len(access) == 1 and access[0]["status"] == sent[0][0], access
            outcomes.append(sent[0])
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    # Answered directly: the happy ones and the domain's own refusals; the rest by the stack.
    assert [o[0] for o in outcomes] == [s for s, _ in EXPECTED]
    assert served == [
        _template(path)
        for (_, answered), (_, path, _, _) in zip(EXPECTED, REQUESTS, strict=True)
        if answered
    ]
    return outcomes


def test_the_direct_path_answers_as_the_stack_does(
    pair: tuple[TestClient, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    direct, stack = pair
    outcomes = _drive(direct, stack, monkeypatch)
    # What the stages give every answer is there: the version, its id, the log line.
    for _, _, headers, logged in outcomes:
        names = [name for name, _ in headers]
        assert "openstack-api-version" in names and "x-request-id" in names
        assert logged[-1]["logger"] == "loadmaster.api.access"
    # Both databases went the same way: the same VMs in the same states, on the same host.
    states = [
        sorted((v["name"], v["state"], v["host"]) for v in ok(client.get("/vms"))["vms"])
        for client in (direct, stack)
    ]
    assert states[0] == states[1]
    assert states[0] == [("a", "pending", "h0"), ("b", "pending", "h0"), ("c", "requested", None)]


class _Dummy:
    """A stage added later: a header on every answer and a log line with a field."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        logging.getLogger("loadmaster.api.dummy").info(
            "dummy", extra={"fields": {"dummy_path": scope["path"]}}
        )

        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-dummy-stage", b"seen")]
            await send(message)

        await self.app(scope, receive, marked)


def test_a_stage_added_to_the_pipeline_is_on_the_direct_path_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stages = pipeline.stages

    def with_dummy(
        app: FastAPI, routes: list[APIRoute], max_body_size: int
    ) -> list[pipeline.Stage]:
        return [*stages(app, routes, max_body_size), pipeline.Stage(_Dummy)]

    monkeypatch.setattr(pipeline, "stages", with_dummy)
    direct, stack = _client(tmp_path, "direct", True), _client(tmp_path, "stack", False)
    try:
        outcomes = _drive(direct, stack, monkeypatch)
    finally:
        _close(direct, stack)
    # Innermost, the stage is passed by every request no other stage refused, those
    # the direct path answered included (their outcomes are the stack's, checked above).
    answered = [o for o, (_, direct) in zip(outcomes, EXPECTED, strict=True) if direct]
    assert answered
    for _, _, headers, logged in answered:
        assert ("x-dummy-stage", "seen") in headers
        assert [r["dummy_path"] for r in logged if r["logger"] == "loadmaster.api.dummy"]


def test_a_report_of_measurements_only_is_answered_without_a_thread(
    pair: tuple[TestClient, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    direct, _ = pair
    agents = direct.app.state.lm.host_agents  # type: ignore[attr-defined]
    threads: list[str] = []
    report = agents.report

    def noted(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return report(*args, **kwargs)

    monkeypatch.setattr(agents, "report", noted)
    ok(direct.post("/hosts/h0/report", json=json.loads(MEASURED)))
    ok(direct.post("/hosts/h0/report", json=json.loads(FULL_REPORT)))
    measured, full = threads
    # The measurements go to memory, on the event loop; a reconciliation reads the
    # ledger, in a thread of the direct path's pool.
    assert not measured.startswith(THREAD_PREFIX) and full.startswith(THREAD_PREFIX)


def test_every_hot_path_is_answered_directly(tmp_path: Path) -> None:
    app = create_app(loadmaster.open(f"sqlite:///{tmp_path / 'x.db'}"))
    served = {(r.method, r.route.path) for r in app.state.direct.routes}
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
