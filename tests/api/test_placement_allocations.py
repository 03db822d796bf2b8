"""Placement's allocation API on the one ledger: plain consumers, VMs' consumers and
allocation candidates all see pending claims as used, and a VM's consumer keeps the
VM's rules."""

from __future__ import annotations

import uuid
from typing import Any

from api_helpers import Live, build_cluster, ok, table_rows

CONSUMER = str(uuid.uuid4())


def _providers(live: Live) -> dict[str, str]:
    return {h["name"]: h["uuid"] for h in ok(live.admin.get("/hosts"))["hosts"]}


def _pending_on_h0(live: Live, count: int) -> list[str]:
    vms = [
        ok(live.admin.post("/vms", json={"name": f"v{i}", "flavor": "small"}), 201)["uuid"]
        for i in range(count)
    ]
    spec = {"vms": vms, "include_hosts": ["h0"]}
    ok(live.admin.post("/schedule", json={"requests": [spec]}))
    return vms


def _put(live: Live, consumer: str, allocations: dict[str, Any], generation: Any) -> Any:
    body = {
        "allocations": {rp: {"resources": r} for rp, r in allocations.items()},
        "project_id": "p",
        "user_id": "u",
        "consumer_generation": generation,
        "consumer_type": "INSTANCE",
    }
    return live.admin.put(f"/allocations/{consumer}", json=body)


def test_a_plain_consumer_cannot_take_what_pending_claims_hold(live: Live) -> None:
    build_cluster(live.admin)  # 8 VCPU per host; "small" takes 2
    rps = _providers(live)
    _pending_on_h0(live, 3)  # 6 VCPU pending on h0, nothing running yet
    before = table_rows(live.lm)
    refused = _put(live, CONSUMER, {rps["h0"]: {"VCPU": 4}}, None)
    assert refused.status_code == 409 and "exceed the capacity" in refused.text
    assert table_rows(live.lm) == before
    assert _put(live, CONSUMER, {rps["h0"]: {"VCPU": 2}}, None).status_code == 204
    got = ok(live.admin.get(f"/allocations/{CONSUMER}"))
    assert got["allocations"][rps["h0"]]["resources"] == {"VCPU": 2}
    assert got["consumer_generation"] == 1
    stale = _put(live, CONSUMER, {rps["h1"]: {"VCPU": 1}}, 0)
    assert stale.status_code == 409
    assert stale.json()["errors"][0]["code"] == "placement.concurrent_update"
    usages = ok(live.admin.get(f"/resource_providers/{rps['h0']}/usages"))["usages"]
    assert usages["VCPU"] == 8  # 6 pending for VMs + 2 for the plain consumer
    ok(live.admin.delete(f"/allocations/{CONSUMER}"), 204)
    assert ok(live.admin.get(f"/allocations/{CONSUMER}")) == {"allocations": {}}


def test_candidates_count_pending_claims(live: Live) -> None:
    build_cluster(live.admin)
    rps = _providers(live)
    _pending_on_h0(live, 4)  # h0 full, by pending claims only
    found = ok(live.admin.get("/allocation_candidates", params={"resources": "VCPU:1"}))
    hosts = {rp for r in found["allocation_requests"] for rp in r["allocations"]}
    assert hosts == {rps["h1"], rps["h2"]}
    assert found["provider_summaries"][rps["h1"]]["resources"]["VCPU"] == {
        "capacity": 8,
        "used": 0,
    }
    limited = ok(
        live.admin.get("/allocation_candidates", params={"resources": "VCPU:1", "limit": 1})
    )
    assert len(limited["allocation_requests"]) == 1


def test_a_vms_consumer_keeps_the_vms_rules(live: Live) -> None:
    build_cluster(live.admin)
    rps = _providers(live)
    (vm,) = _pending_on_h0(live, 1)
    generation = ok(live.admin.get(f"/allocations/{vm}"))["consumer_generation"]
    resized = _put(live, vm, {rps["h1"]: {"VCPU": 1, "MEMORY_MB": 4096}}, generation)
    assert resized.status_code == 409 and "not resize" in resized.text
    moved = _put(live, vm, {rps["h1"]: {"VCPU": 2, "MEMORY_MB": 4096}}, generation)
    assert moved.status_code == 204, moved.text
    shown = ok(live.admin.get(f"/vms/{vm}"))
    assert (shown["state"], shown["host"]) == ("pending", "h1")
    # The GPU flavor's hosts: only h0 has CUSTOM_GPU; a write elsewhere is refused.
    gpu = ok(live.admin.post("/vms", json={"name": "g", "flavor": "gpu"}), 201)["uuid"]
    elsewhere = _put(live, gpu, {rps["h2"]: {"VCPU": 1, "MEMORY_MB": 1024, "CUSTOM_GPU": 1}}, None)
    assert elsewhere.status_code == 409 and "CUSTOM_GPU" in elsewhere.text
    assert ok(live.admin.get(f"/vms/{gpu}"))["state"] == "requested"
