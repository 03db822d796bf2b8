"""``POST /bulk/hosts``: a cloud's hosts registered in one request, all or none."""

from __future__ import annotations

from api_helpers import Live, ok, table_rows


def _host(i: int) -> dict[str, object]:
    return {
        "name": f"bulk-{i}",
        "inventories": {
            "VCPU": {"total": 64, "allocation_ratio": 4.0},
            "MEMORY_MB": {"total": 4096},
        },
        "traits": ["HW_CPU_X86_AVX2"] if i % 2 else [],
        "aggregates": ["rack-1"],
    }


def test_many_hosts_in_one_request_as_post_hosts_makes_each(live: Live) -> None:
    made = ok(live.admin.post("/bulk/hosts", json={"hosts": [_host(i) for i in range(50)]}), 201)
    assert [h["name"] for h in made["hosts"]] == [f"bulk-{i}" for i in range(50)]
    one = ok(live.admin.get("/hosts/bulk-1"))
    assert one["traits"] == ["HW_CPU_X86_AVX2"] and one["aggregates"] == ["rack-1"]
    inventory = ok(live.admin.get(f"/resource_providers/{one['uuid']}/inventories/VCPU"))
    assert inventory["total"] == 64 and inventory["allocation_ratio"] == 4.0


def test_one_bad_host_refuses_them_all_naming_it(live: Live) -> None:
    ok(live.admin.post("/hosts", json=_host(4)), 201)
    before = table_rows(live.lm)
    hosts = [_host(i) for i in range(4)]
    hosts[3]["inventories"] = {"VCPU": {"total": 0}}
    refused = live.admin.post("/bulk/hosts", json={"hosts": hosts})
    assert refused.status_code == 400
    assert refused.json()["field"] == "hosts[3].inventories.VCPU.total"
    hosts[3] = _host(1)  # the same name twice
    refused = live.admin.post("/bulk/hosts", json={"hosts": hosts})
    assert refused.status_code == 409 and refused.json()["field"] == "hosts[3].name"
    assert "hosts[1]" in refused.json()["detail"]
    refused = live.admin.post("/bulk/hosts", json={"hosts": [_host(9), _host(4)]})
    assert refused.status_code == 409 and "bulk-4" in refused.json()["detail"]
    assert refused.json()["field"] == "hosts[1].name"
    assert table_rows(live.lm) == before


def test_only_an_admin_registers_hosts(live: Live) -> None:
    assert live.reader.post("/bulk/hosts", json={"hosts": [_host(0)]}).status_code == 403
    assert ok(live.admin.get("/hosts"))["hosts"] == []
