"""Resource classes on both paths: Placement's shape and rules on ``/resource_classes``,
loadmaster's kind/unit/description on ``/classes``, one set of classes behind both."""

from __future__ import annotations

from api_helpers import Live, build_cluster, ok, table_rows


def at(version: str) -> dict[str, str]:
    return {"OpenStack-API-Version": f"placement {version}"}


def test_one_class_two_views(live: Live) -> None:
    build_cluster(live.admin)
    placement = ok(live.admin.get("/resource_classes/CUSTOM_GPU"), 200)
    assert placement == {
        "name": "CUSTOM_GPU",
        "links": [{"rel": "self", "href": "/resource_classes/CUSTOM_GPU"}],
    }
    own = ok(live.admin.get("/classes/CUSTOM_GPU"), 200)
    assert (own["kind"], own["standard"]) == ("accelerator", False)
    names = {c["name"] for c in ok(live.admin.get("/resource_classes"), 200)["resource_classes"]}
    assert names == {c["name"] for c in ok(live.admin.get("/classes"), 200)["classes"]}


def test_placement_create_put_and_delete(live: Live) -> None:
    made = live.admin.post("/resource_classes", json={"name": "CUSTOM_A"})
    assert made.status_code == 201 and made.content == b""
    assert made.headers["location"].endswith("/resource_classes/CUSTOM_A")
    again = live.admin.post("/resource_classes", json={"name": "CUSTOM_A"})
    assert again.status_code == 409
    assert "Conflicting resource class already exists" in again.text
    assert live.admin.put("/resource_classes/CUSTOM_B").status_code == 201
    assert live.admin.put("/resource_classes/CUSTOM_B").status_code == 204
    refused = live.admin.post("/resource_classes", json={"name": "CUSTOM_C", "kind": "gpu"})
    assert refused.status_code == 400
    assert "Additional properties are not allowed" in refused.text
    standard = live.admin.delete("/resource_classes/VCPU")
    assert standard.status_code == 400 and "Cannot delete standard" in standard.text
    assert live.admin.delete("/resource_classes/CUSTOM_A").status_code == 204


def test_rename_keeps_inventories_and_spares_named_classes(live: Live) -> None:
    build_cluster(live.admin)  # flavor "gpu" names CUSTOM_GPU
    before = table_rows(live.lm)
    named = live.admin.put(
        "/resource_classes/CUSTOM_GPU", json={"name": "CUSTOM_GPU2"}, headers=at("1.6")
    )
    assert named.status_code == 409 and "keeps its name" in named.text
    assert table_rows(live.lm) == before
    assert live.admin.put("/resource_classes/CUSTOM_X", headers=at("1.7")).status_code == 201
    host = live.admin.get("/hosts/h1").json()
    inventory = {
        "resource_class": "CUSTOM_X",
        "resource_provider_generation": host["generation"],
        "total": 4,
    }
    ok(live.admin.post(f"/resource_providers/{host['uuid']}/inventories", json=inventory), 201)
    renamed = live.admin.put(
        "/resource_classes/CUSTOM_X", json={"name": "CUSTOM_Y"}, headers=at("1.6")
    )
    assert ok(renamed, 200)["name"] == "CUSTOM_Y"
    inventories = ok(live.admin.get(f"/resource_providers/{host['uuid']}/inventories"), 200)
    assert inventories["inventories"]["CUSTOM_Y"]["total"] == 4
    assert "CUSTOM_X" not in inventories["inventories"]


def test_resources_filter_counts_pending_claims(live: Live) -> None:
    build_cluster(live.admin)  # h0..h2 with 8 VCPU each; "small" takes 2
    vms = [
        ok(live.admin.post("/vms", json={"name": f"v{i}", "flavor": "small"}), 201)
        for i in range(4)
    ]
    spec = {"vms": [vm["uuid"] for vm in vms], "include_hosts": ["h0"]}
    placed = ok(live.admin.post("/schedule", json={"requests": [spec]}), 200)
    assert {p["host"] for p in placed["placements"]} == {"h0"}  # pending, not started
    names = {
        p["name"]
        for p in ok(live.admin.get("/resource_providers?resources=VCPU:1"), 200)[
            "resource_providers"
        ]
    }
    assert names == {"h1", "h2"}
    bad = live.admin.get("/resource_providers?resources=VCPU:fred")
    assert bad.status_code == 400 and "expected positive integer amount" in bad.text


def test_errors_are_html_for_a_browser_and_json_otherwise(live: Live) -> None:
    page = live.admin.get("/no/such/path", headers={"accept": "text/html"})
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "<h1>404 Not Found</h1>" in page.text
    plain = live.admin.get("/no/such/path")
    assert plain.headers["content-type"] == "application/json"
    assert plain.json()["errors"][0]["status"] == 404
