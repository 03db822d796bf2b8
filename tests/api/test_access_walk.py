"""Every write route in the OpenAPI document refuses a missing token (401) and a reader (403),
every route refuses a member (403, as Placement's default policy refuses non-admins), and
no such attempt changes the database."""

from __future__ import annotations

import re

from api_helpers import Live, build_cluster, table_rows

WRITE_METHODS = {"post", "put", "patch", "delete"}


def test_every_write_route_refuses_anonymous_and_reader(live: Live) -> None:
    build_cluster(live.admin)
    document = live.reader.get("/openapi.json").json()
    routes = [
        (method.upper(), re.sub(r"\{[^}]+\}", "x", path))
        for path, operations in document["paths"].items()
        for method in operations
        if method in WRITE_METHODS
    ]
    assert len(routes) >= 20, routes  # the walk must actually cover the API
    before = table_rows(live.lm)
    for method, path in routes:
        anonymous = live.anonymous.request(method, path, json={})
        assert anonymous.status_code == 401, (method, path, anonymous.text)
        reader = live.reader.request(method, path, json={})
        assert reader.status_code == 403, (method, path, reader.text)
        assert reader.json()["code"]
    assert table_rows(live.lm) == before


def test_every_route_refuses_a_member(live: Live) -> None:
    build_cluster(live.admin)
    document = live.admin.get("/openapi.json").json()
    open_paths = {"/", "/healthz", "/openapi.json"}
    routes = [
        (method.upper(), re.sub(r"\{[^}]+\}", "x", path))
        for path, operations in document["paths"].items()
        for method in operations
        if path not in open_paths
    ]
    before = table_rows(live.lm)
    for method, path in routes:
        answer = live.member.request(method, path, json={} if method != "GET" else None)
        assert answer.status_code == 403, (method, path, answer.text)
        assert answer.json()["errors"][0]["title"] == "Forbidden"
    assert live.member.get("/").status_code == 200  # version discovery needs no rights
    assert table_rows(live.lm) == before
