"""POST /hosts/{name}/drain and GET /hosts/{name}: admin only, progress on the host, bad
input refused with the field named and nothing changed."""

from __future__ import annotations

from api_helpers import Live, build_cluster, new_vm, ok, table_rows


def test_drain_over_http_shows_progress_until_the_host_is_empty(live: Live) -> None:
    admin, reader = live.admin, live.reader
    build_cluster(admin)
    vms = [new_vm(admin, f"web-{i}") for i in range(3)]
    for vm in vms:  # all on h0 (the API's start lets the scheduler choose)
        live.lm.allocations.claim(vm, "h0")
        ok(admin.post(f"/vms/{vm}/up"))
    host = ok(reader.get("/hosts/h0"))
    assert (host["state"], host["status"], host["drain"]["vms_left"]) == ("up", "up", 3)

    assert reader.post("/hosts/h0/drain", json={}).status_code == 403
    result = ok(admin.post("/hosts/h0/drain", json={"force": False}))
    assert set(result["moved"]) == set(vms) and "h0" not in result["moved"].values()
    assert (result["state"], result["status"], result["unplaced"]) == (
        "maintenance",
        "draining",
        [],
    )
    progress = ok(reader.get("/hosts/h0"))
    assert progress["status"] == "draining" and progress["drain"]["migrating"] == 3
    assert {v["target_host"] for v in progress["drain"]["vms"]} <= {"h1", "h2"}
    for vm in vms:  # the agents complete the migrations
        ok(admin.post(f"/vms/{vm}/up"))
    done = ok(reader.get("/hosts/h0"))
    assert (done["status"], done["drain"]["vms_left"], done["drain"]["vms"]) == (
        "maintenance",
        0,
        [],
    )
    # Draining an empty host again is harmless; no body means force=false.
    again = ok(admin.post("/hosts/h0/drain"))
    assert again["moved"] == {} and again["status"] == "maintenance"


def test_a_vm_that_fits_nowhere_comes_back_explained_and_force_stops_it(live: Live) -> None:
    admin = live.admin
    build_cluster(admin, hosts=1)  # only h0 has the GPU the VM needs
    h1 = {"name": "h1", "inventories": {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}}
    ok(admin.post("/hosts", json=h1), 201)
    vm = new_vm(admin, "gpu-1", "gpu")
    ok(admin.post(f"/vms/{vm}/start"))
    ok(admin.post(f"/vms/{vm}/up"))
    result = ok(admin.post("/hosts/h0/drain", json={}))
    (unplaced,) = result["unplaced"]
    assert unplaced["vm"] == vm and unplaced["stopped"] is False
    assert unplaced["code"] == "loadmaster.no_valid_host"
    assert "no host fits" in unplaced["explanation"]["message"]
    assert "CUSTOM_GPU" in unplaced["explanation"]["message"]
    assert result["status"] == "draining"
    forced = ok(admin.post("/hosts/h0/drain", json={"force": True}))
    assert forced["stopped"] == [vm] and forced["status"] == "maintenance"
    assert ok(admin.get(f"/vms/{vm}"))["state"] == "stopped"


def test_bad_drain_requests_name_the_field_and_change_nothing(live: Live) -> None:
    admin = live.admin
    build_cluster(admin, hosts=1)
    before = table_rows(live.lm)
    missing = admin.post("/hosts/nosuch/drain", json={})
    assert missing.status_code == 404 and missing.json()["field"] == "host"
    assert "nosuch" in missing.json()["detail"]
    assert admin.get("/hosts/nosuch").status_code == 404
    for body, field in (({"force": "yes"}, "force"), ({"forced": True}, "forced")):
        response = admin.post("/hosts/h0/drain", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["field"] == field, response.text
    assert table_rows(live.lm) == before
