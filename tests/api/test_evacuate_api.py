"""POST /hosts/{name}/evacuate: admin only, documented in OpenAPI, refused (409, nothing
changed) until the host is known down, then the dead host's VMs start elsewhere."""

from __future__ import annotations

from api_helpers import Live, build_cluster, new_vm, ok, table_rows


def test_evacuate_over_http_needs_the_host_known_down(live: Live) -> None:
    admin, reader = live.admin, live.reader
    build_cluster(admin)
    ha = new_vm(admin, "db", tags=["ha"])
    plain = new_vm(admin, "web")
    for vm in (plain, ha):
        live.lm.allocations.claim(vm, "h0")
        ok(admin.post(f"/vms/{vm}/up"))
    before = table_rows(live.lm)

    assert reader.post("/hosts/h0/evacuate", json={"confirm_down": True}).status_code == 403
    refused = admin.post("/hosts/h0/evacuate")
    assert refused.status_code == 409, refused.text
    assert refused.json()["field"] == "confirm_down"
    assert "--confirm-down" in refused.json()["detail"]
    bad = admin.post("/hosts/h0/evacuate", json={"confirm_down": "yes"})
    assert bad.status_code == 400 and "confirm_down" in bad.text
    assert table_rows(live.lm) == before

    result = ok(admin.post("/hosts/h0/evacuate", json={"confirm_down": True}))
    assert (result["host"], result["known_down"]) == ("h0", "confirmed")
    assert result["order"] == [ha, plain]
    assert set(result["moved"]) == {ha, plain} and "h0" not in result["moved"].values()
    assert result["names"] == {ha: "db", plain: "web"}
    assert ok(reader.get("/hosts/h0"))["state"] == "down"
    again = ok(admin.post("/hosts/h0/evacuate"))
    assert (again["known_down"], again["moved"], again["order"]) == ("already", {}, [])


def test_evacuate_is_in_the_openapi_document(live: Live) -> None:
    doc = ok(live.reader.get("/openapi.json"))
    operation = doc["paths"]["/hosts/{host_name}/evacuate"]["post"]
    assert "known down" in operation["description"]
    schema = doc["components"]["schemas"]["EvacuateRequest"]
    assert schema["additionalProperties"] is False and "confirm_down" in schema["properties"]
