"""Every write route in the OpenAPI document refuses a missing token (401) and a reader (403),
and neither attempt changes the database."""

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
