"""The API over real HTTP against a uvicorn server, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from api_helpers import Live, build_cluster, new_vm, ok, table_rows


def test_vm_lifecycle_over_http(live: Live) -> None:
    admin, reader = live.admin, live.reader
    build_cluster(admin)
    hosts = ok(reader.get("/hosts"))["hosts"]
    assert [h["name"] for h in hosts] == ["h0", "h1", "h2"]
    assert hosts[0]["root_provider_uuid"] == hosts[0]["uuid"]

    uuid = new_vm(admin, "web-1")
    started = ok(admin.post(f"/vms/{uuid}/start"))
    host = started["placement"]["host"]
    assert started["vm"]["state"] == "pending" and host in {"h0", "h1", "h2"}

    allocations = ok(reader.get(f"/vms/{uuid}/allocations"))["allocations"]
    (entry,) = allocations.values()
    assert entry["name"] == host
    assert entry["pending"] == {"MEMORY_MB": 4096, "VCPU": 2} and entry["active"] == {}
    usages = ok(reader.get(f"/resource_providers/{host}/usages"))
    assert usages["usages"]["VCPU"] == 2  # Placement's figure counts pending as used
    split = ok(reader.get(f"/hosts/{host}/usages"))["classes"]
    assert split["VCPU"]["pending"] == 2

    assert ok(admin.post(f"/vms/{uuid}/up"))["state"] == "running"
    assert ok(reader.get(f"/hosts/{host}/usages"))["classes"]["VCPU"]["active"] == 2
    by_type = ok(reader.get("/usages", params={"project_id": "default"}))["usages"]
    assert by_type["INSTANCE"] == {"VCPU": 2, "MEMORY_MB": 4096, "consumer_count": 1}

    moved = ok(admin.post(f"/vms/{uuid}/migrate", json={"reason": "maintenance"}))
    target = moved["placement"]["host"]
    assert moved["vm"]["state"] == "migrating" and target != host
    assert ok(admin.post(f"/vms/{uuid}/up"))["host"] == target

    assert ok(admin.post(f"/vms/{uuid}/stop"))["state"] == "stopped"
    assert ok(reader.get(f"/vms/{uuid}/allocations"))["allocations"] == {}
    ok(admin.delete(f"/vms/{uuid}"), 204)
    ok(admin.delete(f"/vms/{uuid}"), 204)  # deleting again is harmless
    assert ok(reader.get(f"/vms/{uuid}"))["state"] == "deleted"


def test_inventories_traits_aggregates_are_generation_guarded(live: Live) -> None:
    admin = live.admin
    build_cluster(admin, hosts=1)
    current = ok(admin.get("/resource_providers/h0/traits"))
    generation = current["resource_provider_generation"]
    body = {"resource_provider_generation": generation, "traits": ["CUSTOM_FAST"]}
    changed = ok(admin.put("/resource_providers/h0/traits", json=body))
    assert changed == {"resource_provider_generation": generation + 1, "traits": ["CUSTOM_FAST"]}

    before = table_rows(live.lm)
    for path, payload in [
        ("/traits", {"traits": []}),
        ("/aggregates", {"aggregates": []}),
        ("/inventories", {"inventories": {"VCPU": {"total": 4}}}),
        ("/inventories/VCPU", {"total": 4}),
    ]:
        stale = {"resource_provider_generation": generation, **payload}
        response = admin.put(f"/resource_providers/h0{path}", json=stale)
        assert response.status_code == 409, path
        assert response.json()["code"] == "loadmaster.concurrent_update"
        assert response.json()["field"] == "generation"
    assert table_rows(live.lm) == before

    inventories = ok(admin.get("/resource_providers/h0/inventories"))
    assert inventories["inventories"]["VCPU"]["total"] == 8
    fresh = {
        "resource_provider_generation": inventories["resource_provider_generation"],
        "inventories": {"VCPU": {"total": 16, "allocation_ratio": 2.0}},
    }
    replaced = ok(admin.put("/resource_providers/h0/inventories", json=fresh))
    assert list(replaced["inventories"]) == ["VCPU"]
    capacity = ok(admin.get("/usages/hosts"))["hosts"]["h0"]["VCPU"]["capacity"]
    assert capacity == 32


def test_no_valid_host_is_409_with_explanation(live: Live) -> None:
    build_cluster(live.admin)
    ok(live.admin.put("/hosts/h0", json={"state": "maintenance"}))
    uuid = new_vm(live.admin, "gpu-1", "gpu")
    response = live.admin.post(f"/vms/{uuid}/start")
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "loadmaster.no_valid_host"
    explanation = body["explanation"]
    assert explanation["candidates"] == 0 and explanation["hosts"] == 3
    reasons = {f["filter"]: f["reasons"] for f in explanation["filters"]}
    assert reasons["host_state"] == {"maintenance": 1}
    assert sum(reasons["resources"].values()) == 2
    assert ok(live.reader.get(f"/vms/{uuid}"))["state"] == "requested"


def test_schedule_dry_run_capacity_and_groups(live: Live) -> None:
    admin = live.admin
    build_cluster(admin)
    group = ok(admin.post("/server_groups", json={"name": "web", "policy": "anti-affinity"}), 201)
    assert group["members"] == []
    uuids = [new_vm(admin, f"web-{i}", group="web") for i in range(3)]

    dry = ok(admin.post("/schedule", json={"requests": [{"vms": uuids}], "dry_run": True}))
    assert dry["dry_run"] and dry["placed"] == 3
    assert {v["state"] for v in ok(admin.get("/vms"))["vms"]} == {"requested"}

    placed = ok(admin.post("/schedule", json={"requests": [{"vms": uuids}], "gang": True}))
    assert placed["ok"] and len({p["host"] for p in placed["placements"]}) == 3
    assert sorted(ok(admin.get("/server_groups/web"))["members"]) == sorted(uuids)

    fourth = new_vm(admin, "web-3", group="web")
    refused = ok(admin.post("/schedule", json={"requests": [{"vms": [fourth]}]}))
    assert refused["failed"] == 1
    assert refused["placements"][0]["error"]["code"] == "loadmaster.no_valid_host"

    capacity = ok(admin.get("/capacity", params={"flavor": "small"}))
    # 8 VCPU and 16 GiB per host, 2 VCPU and 4 GiB taken: 3 more small ones fit on each.
    assert capacity["total"] == 9 and set(capacity["per_host"]) == {"h0", "h1", "h2"}
    hypothetical = {"requests": [{"flavor": "gpu", "count": 3}], "dry_run": True}
    assert ok(admin.post("/schedule", json=hypothetical))["placed"] == 2

    explained = ok(admin.post("/schedule/explain", json={"flavor": "gpu"}))
    assert explained["candidates"] == 1


def test_host_report_activates_what_the_host_runs(live: Live) -> None:
    admin = live.admin
    build_cluster(admin, hosts=1)
    booted, lost = new_vm(admin, "a"), new_vm(admin, "b")
    for uuid in (booted, lost):
        ok(admin.post(f"/vms/{uuid}/start"))
    later = (datetime.now(UTC) + timedelta(seconds=5)).isoformat()
    report = {"running_vms": [booted], "usage": {"VCPU": 2}, "load": {"cpu": 0.4}, "as_of": later}
    result = ok(admin.post("/hosts/h0/report", json=report))
    assert result == {"activated": [booted], "released": [lost], "stopped": [], "unexpected": []}
    assert ok(admin.get(f"/vms/{booted}"))["state"] == "running"
    assert ok(admin.get(f"/vms/{lost}"))["state"] == "requested"


def test_metrics_count_placements_and_pending_records(live: Live) -> None:
    build_cluster(live.admin, hosts=1)
    uuid = new_vm(live.admin, "m")
    ok(live.admin.post(f"/vms/{uuid}/start"))
    ok(live.admin.get(f"/vms/{uuid}"))
    text = live.reader.get("/metrics").text
    assert 'loadmaster_placements_total{outcome="placed"} 1.0' in text
    assert "loadmaster_pending_records 2.0" in text  # VCPU and MEMORY_MB records
    assert 'loadmaster_host_pending_records{host="h0"} 2.0' in text
    assert "loadmaster_decision_seconds_count 1.0" in text
    assert 'route="/vms/{uuid}",status="200"' in text  # templated: no series per VM


def test_request_ids_are_echoed_or_made(live: Live) -> None:
    given = live.reader.get("/flavors", headers={"X-Request-ID": "trace-42"})
    assert given.headers["x-request-id"] == "trace-42"
    made = live.anonymous.get("/flavors")
    assert made.status_code == 401 and re.fullmatch(
        r"req-[0-9a-f-]{36}", made.headers["x-request-id"]
    )
    assert made.headers["openstack-request-id"] == made.headers["x-request-id"]
    assert made.json()["errors"][0]["request_id"] == made.headers["x-request-id"]
    odd = live.reader.get("/flavors", headers={"X-Request-ID": "bad id\twith spaces"})
    assert odd.headers["x-request-id"] != "bad id\twith spaces"


def test_tokens_and_roles(live: Live) -> None:
    build_cluster(live.admin, hosts=1)
    assert live.anonymous.get("/healthz").json() == {"status": "ok"}
    assert live.anonymous.get("/openapi.json").status_code == 200

    missing = live.anonymous.get("/flavors")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["code"] == "loadmaster.unauthenticated"
    wrong = live.anonymous.get("/flavors", headers={"Authorization": "Bearer admin-5f1c0e1d9b"})
    assert wrong.status_code == 401
    basic = live.anonymous.get("/flavors", headers={"Authorization": "Basic YWRtaW46YWRtaW4="})
    assert basic.status_code == 401

    assert len(ok(live.reader.get("/flavors"))["flavors"]) == 2
    before = table_rows(live.lm)
    for method, path, body in [
        ("POST", "/flavors", {"name": "x", "resources": {"VCPU": 1}}),
        ("DELETE", "/flavors/small", None),
        ("PUT", "/traits/CUSTOM_NEW", None),
        ("PUT", "/hosts/h0", {"state": "down"}),
        ("POST", "/hosts/h0/report", {"running_vms": []}),
    ]:
        response = live.reader.request(method, path, json=body)
        assert response.status_code == 403, (method, path)
        assert response.json()["code"] == "loadmaster.forbidden"
        anonymous = live.anonymous.request(method, path, json=body)
        assert anonymous.status_code == 401
    assert table_rows(live.lm) == before


def _chunks(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


JSON = {"Content-Type": "application/json"}
BIG = b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'", "resources": {}}'


@pytest.mark.parametrize(
    ("case", "request_kwargs", "status", "code", "field"),
    [
        (
            "bad JSON",
            {"content": b'{"name": "x", ', "headers": JSON},
            400,
            "loadmaster.invalid_json",
            "body",
        ),
        (
            "a body not saying its type",
            {"content": b'{"name": "x"}'},
            400,
            "loadmaster.invalid",
            "header.content-type",
        ),
        ("not an object", {"json": ["small"]}, 400, "loadmaster.invalid", None),
        (
            "wrong type",
            {"json": {"name": "y", "resources": {"VCPU": "2"}}},
            400,
            "loadmaster.invalid",
            "resources.VCPU",
        ),
        (
            "bool as number",
            {"json": {"name": "y", "resources": {"VCPU": True}}},
            400,
            "loadmaster.invalid",
            "resources.VCPU",
        ),
        (
            "unknown field",
            {"json": {"name": "y", "resources": {}, "colour": "red"}},
            400,
            "loadmaster.invalid",
            "colour",
        ),
        ("missing field", {"json": {"resources": {}}}, 400, "loadmaster.invalid", "name"),
        (
            "domain rule",
            {"json": {"name": "y", "resources": {"CUSTOM_NOPE": 1}}},
            404,
            "loadmaster.not_found",
            "resources.CUSTOM_NOPE",
        ),
        (
            "not JSON at all",
            {"content": b"name=y", "headers": {"Content-Type": "text/plain"}},
            415,
            "loadmaster.unsupported_media_type",
            "body",
        ),
        ("oversized", {"content": BIG, "headers": JSON}, 413, "loadmaster.body_too_large", None),
        (
            "oversized, chunked",
            {"content": _chunks(BIG), "headers": JSON},
            413,
            "loadmaster.body_too_large",
            None,
        ),
    ],
)
def test_bad_bodies_get_a_clear_4xx_and_change_nothing(
    live: Live,
    case: str,
    request_kwargs: dict[str, object],
    status: int,
    code: str,
    field: str | None,
) -> None:
    build_cluster(live.admin, hosts=1)
    before = table_rows(live.lm)
    if isinstance(request_kwargs.get("content"), Iterator):
        request_kwargs = {"content": _chunks(BIG), "headers": JSON}  # a generator runs once
    response = live.admin.post("/flavors", **request_kwargs)  # type: ignore[arg-type]
    assert response.status_code == status, (case, response.text)
    body = response.json()
    assert body["code"] == code and body["title"] and body["detail"], case
    assert body.get("field") == field, case
    assert table_rows(live.lm) == before, case


def test_start_on_a_chosen_host_is_admin_only_and_still_filtered(live: Live) -> None:
    build_cluster(live.admin)
    uuid = new_vm(live.admin, "pinned")
    # The spread policy would pick an empty host; the operator's choice is h0.
    new_vm_on_h1 = new_vm(live.admin, "other")
    ok(live.admin.put(f"/vms/{new_vm_on_h1}/allocations", json={"host": "h0"}))
    refused = live.reader.post(f"/vms/{uuid}/start", json={"host": "h0"})
    assert refused.status_code == 403
    started = ok(live.admin.post(f"/vms/{uuid}/start", json={"host": "h0"}))
    assert started["placement"]["host"] == "h0" and started["vm"]["host"] == "h0"

    ok(live.admin.put("/hosts/h2", json={"state": "maintenance"}))
    second = new_vm(live.admin, "second")
    response = live.admin.post(f"/vms/{second}/start", json={"host": "h2"})
    assert response.status_code == 409, response.text
    body = response.json()
    assert body["code"] == "loadmaster.no_valid_host"
    assert "cannot start on host h2: maintenance (host_state)" in body["detail"]
    assert "include_hosts" not in body["detail"]
    assert ok(live.reader.get(f"/vms/{second}"))["state"] == "requested"

    gpu = new_vm(live.admin, "gpu-1", "gpu")
    response = live.admin.post(f"/vms/{gpu}/start", json={"host": "h1"})
    assert response.status_code == 409
    assert (
        "cannot start on host h1: no CUSTOM_GPU inventory (resources)" in response.json()["detail"]
    )
    missing = live.admin.post(f"/vms/{gpu}/start", json={"host": "nowhere"})
    assert missing.status_code == 404 and "nowhere" in missing.json()["detail"]
    assert ok(live.reader.get(f"/vms/{gpu}"))["state"] == "requested"
