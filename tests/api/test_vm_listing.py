"""GET /vms filtered and paged by the server (name, tag, host with incoming, limit,
offset), and the read-only GET /audit."""

from __future__ import annotations

from api_helpers import Live, build_cluster, new_vm, ok


def test_vms_are_filtered_and_paged_by_the_server(live: Live) -> None:
    admin, reader = live.admin, live.reader
    build_cluster(admin)
    uuids = [
        new_vm(admin, f"lv-{i}", tags=["gold", "priority:2"] if i % 2 else ["golden"])
        for i in range(5)
    ]

    def names(**params: str | int) -> list[str]:
        return [v["name"] for v in ok(reader.get("/vms", params=params))["vms"]]

    assert names(name="lv-3") == ["lv-3"]
    # "gold" matches the tag itself, never a tag that merely contains it.
    assert names(tag="gold") == ["lv-1", "lv-3"]
    assert names(tag="priority:2") == ["lv-1", "lv-3"]
    assert names(limit=2, offset=1) == ["lv-1", "lv-2"]
    assert names(limit=0) == []

    ok(admin.post(f"/vms/{uuids[0]}/start"))
    source = ok(admin.post(f"/vms/{uuids[0]}/up"))["host"]
    target = next(h for h in ("h0", "h1", "h2") if h != source)
    ok(admin.post(f"/vms/{uuids[0]}/migrate", json={"host": target}))
    assert names(host=target) == []
    assert names(host=target, incoming="true") == ["lv-0"]
    assert names(host=source) == ["lv-0"]

    bad = reader.get("/vms", params={"limit": -1})
    assert bad.status_code == 400 and bad.json()["field"] == "query.limit"


def test_audit_over_http_reads_only(live: Live) -> None:
    build_cluster(live.admin)
    assert ok(live.reader.get("/audit")) == {"problems": [], "warnings": []}
    assert live.anonymous.get("/audit").status_code == 401
