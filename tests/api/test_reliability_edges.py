"""Issue 13's edges over HTTP, on both databases: NUL characters, a 500 on a kept-alive
connection, uuids in any case, reports from far away in time, retried creates."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from api_helpers import Live, build_cluster, new_vm, ok, table_rows

NUL = "\x00"


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/resource_providers", {"name": f"a{NUL}b"}, "name"),
        ("POST", "/vms", {"name": "v", "flavor": "small", "project_id": f"p{NUL}"}, "project_id"),
        ("POST", "/vms", {"name": "v", "flavor": "small", "tags": ["ok", f"x{NUL}"]}, "tags[1]"),
        ("POST", "/flavors", {"name": "f", "extra_specs": {f"k{NUL}": "v"}}, "extra_specs.k\x00"),
        ("GET", "/resource_providers/h0%00", None, "path.provider"),
        ("GET", "/vms?project_id=a%00", None, "query.project_id"),
        ("PUT", "/traits/CUSTOM_%00", None, "path.name"),
        ("POST", "/hosts/h0/report", {"running_vms": [f"{NUL}"]}, "running_vms[0]"),
    ],
)
def test_nul_anywhere_is_a_400_naming_the_field(
    live: Live, method: str, path: str, body: object, field: str
) -> None:
    build_cluster(live.admin, hosts=1)
    before = table_rows(live.lm)
    response = live.admin.request(method, path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field
    assert "NUL" in response.json()["detail"]
    assert table_rows(live.lm) == before
    # A reader's lookup gets the same answer, not a database error.
    assert live.reader.get("/resource_providers/x%00y").status_code == 400


def test_a_500_keeps_the_connection_open(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**_kwargs: object) -> list[object]:
        raise RuntimeError("a bug that must not show its text: SELECT secret FROM t")

    monkeypatch.setattr(live.lm.hosts, "list", broken)
    where = urlsplit(live.url)
    conn = http.client.HTTPConnection(where.hostname or "", where.port)
    headers = {"Authorization": live.admin.headers["Authorization"]}
    try:
        conn.request("GET", "/resource_providers", headers=headers)
        first = conn.getresponse()
        body = json.loads(first.read())
        assert first.status == 500
        assert body["code"] == "loadmaster.internal"
        assert "SELECT" not in body["detail"]
        assert first.getheader("x-request-id")
        # The next request goes on the same socket; a server that closed it fails here.
        conn.auto_open = 0
        conn.request("GET", "/healthz", headers=headers)
        second = conn.getresponse()
        assert second.status == 200
        second.read()
    finally:
        conn.close()


def test_uuids_are_normalised_everywhere(live: Live) -> None:
    build_cluster(live.admin, hosts=1)
    upper = "5A7B9C0D-1E2F-4A3B-8C4D-5E6F7A8B9C0D"
    created = ok(live.admin.post("/vms", json={"name": "u", "flavor": "small", "uuid": upper}), 201)
    assert created["uuid"] == upper.lower()
    assert ok(live.reader.get(f"/vms/{upper}"))["uuid"] == upper.lower()
    ok(live.admin.post(f"/vms/{upper}/start"))
    ok(live.admin.post(f"/vms/{upper}/up"))
    # The host lists its VM in upper case: the VM runs on, holding its capacity.
    result = ok(live.admin.post("/hosts/h0/report", json={"running_vms": [upper]}))
    assert result["stopped"] == [] and result["unexpected"] == []
    assert live.lm.vms.get(upper.lower()).state == "running"
    assert live.lm.allocations.usages(["h0"])["h0"]["VCPU"].active == 2
    host = ok(live.reader.get("/resource_providers/h0"))
    assert ok(live.reader.get(f"/resource_providers/{host['uuid'].upper()}"))["name"] == "h0"


@pytest.mark.parametrize(
    "as_of", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "1970-01-01T00:00:00Z"]
)
def test_a_report_far_away_in_time_is_refused_and_stores_nothing(live: Live, as_of: str) -> None:
    build_cluster(live.admin, hosts=1)
    vm = new_vm(live.admin, "v")
    ok(live.admin.post(f"/vms/{vm}/start"))
    before = table_rows(live.lm)
    report = {"running_vms": [], "usage": {"VCPU": 1}, "as_of": as_of}
    response = live.admin.post("/hosts/h0/report", json=report)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == "as_of"
    assert table_rows(live.lm) == before


def test_retried_creates_get_the_same_answer(live: Live) -> None:
    build_cluster(live.admin, hosts=1)
    for status in (201, 204):  # created, then already there
        assert live.admin.put("/traits/CUSTOM_RETRIED").status_code == status
    body = {"name": "r", "flavor": "small", "uuid": "0b4e6c1a-3d8f-4e21-9a77-2c5d0e9f1b33"}
    first = ok(live.admin.post("/vms", json=body), 201)
    assert ok(live.admin.post("/vms", json=body), 201) == first
    other = live.admin.post("/vms", json={**body, "name": "other"})
    assert other.status_code == 409
    assert other.json()["field"] == "uuid" and "name" in other.json()["detail"]
    assert len(live.lm.vms.list()) == 1


def test_start_on_a_running_vm_is_a_409_not_a_migration(live: Live) -> None:
    build_cluster(live.admin, hosts=2)
    vm = new_vm(live.admin, "v")
    ok(live.admin.post(f"/vms/{vm}/start"))
    ok(live.admin.post(f"/vms/{vm}/up"))
    before = table_rows(live.lm)
    response = live.admin.post(f"/vms/{vm}/start")
    assert response.status_code == 409, response.text
    assert response.json()["code"] == "loadmaster.invalid_transition"
    assert table_rows(live.lm) == before
    stopped = new_vm(live.admin, "w")
    refused = live.admin.post(f"/vms/{stopped}/migrate", json={"host": "h1"})
    assert refused.status_code == 409 and "only a running VM" in refused.json()["detail"]
