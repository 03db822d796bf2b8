"""Placement's reshaper (``POST /reshaper``, 1.30): a root's VGPU inventory moves onto
child providers together with the allocations that use it, all or nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from api_helpers import Live, build_cluster, ok, table_rows

from loadmaster.pending import audit

V = {"OpenStack-API-Version": "placement 1.39"}
CN, GPU0, GPU1 = (str(uuid.uuid4()) for _ in range(3))
C, D = str(uuid.uuid4()), str(uuid.uuid4())


def _consumer(allocations: dict[str, dict[str, int]], generation: int | None) -> dict[str, Any]:
    return {
        "allocations": {rp: {"resources": r} for rp, r in allocations.items()},
        "project_id": "p",
        "user_id": "u",
        "consumer_generation": generation,
        "consumer_type": "INSTANCE",
    }


def _setup(live: Live) -> None:
    http = live.admin
    assert http.put("/resource_classes/CUSTOM_VGPU", headers=V).status_code == 201
    ok(http.post("/resource_providers", json={"name": "cn", "uuid": CN}, headers=V))
    inventories = {"VCPU": {"total": 8}, "CUSTOM_VGPU": {"total": 4}}
    body = {"resource_provider_generation": 0, "inventories": inventories}
    ok(http.put(f"/resource_providers/{CN}/inventories", json=body, headers=V))
    for name, rp in (("cn-pgpu0", GPU0), ("cn-pgpu1", GPU1)):
        body = {"name": name, "uuid": rp, "parent_provider_uuid": CN}
        ok(http.post("/resource_providers", json=body, headers=V))
    for consumer, held in ((C, {"VCPU": 2, "CUSTOM_VGPU": 2}), (D, {"CUSTOM_VGPU": 1})):
        answer = http.put(f"/allocations/{consumer}", json=_consumer({CN: held}, None), headers=V)
        assert answer.status_code == 204, answer.text


def _generation(live: Live, rp: str) -> int:
    generation: int = ok(live.admin.get(f"/resource_providers/{rp}", headers=V))["generation"]
    return generation


def _reshape(
    live: Live, allocations: dict[str, Any] | None = None, **overrides: Any
) -> dict[str, Any]:
    inventories = {
        CN: {"resource_provider_generation": _generation(live, CN), "inventories": {"VCPU": {"total": 8}}},
        GPU0: {"resource_provider_generation": _generation(live, GPU0), "inventories": {"CUSTOM_VGPU": {"total": 2}}},
        GPU1: {"resource_provider_generation": _generation(live, GPU1), "inventories": {"CUSTOM_VGPU": {"total": 2}}},
    }  # fmt: skip
    if allocations is None:
        allocations = {
            C: _consumer({CN: {"VCPU": 2}, GPU0: {"CUSTOM_VGPU": 2}}, 1),
            D: _consumer({GPU1: {"CUSTOM_VGPU": 1}}, 1),
        }
    return {"inventories": inventories, "allocations": allocations, **overrides}


def test_usage_moves_with_its_inventory(live: Live) -> None:
    _setup(live)
    before = {rp: _generation(live, rp) for rp in (CN, GPU0, GPU1)}
    answer = live.admin.post("/reshaper", json=_reshape(live), headers=V)
    assert answer.status_code == 204, answer.text
    root = ok(live.admin.get(f"/resource_providers/{CN}/inventories", headers=V))
    assert set(root["inventories"]) == {"VCPU"}
    got = ok(live.admin.get(f"/allocations/{C}", headers=V))
    assert {rp: a["resources"] for rp, a in got["allocations"].items()} == {
        CN: {"VCPU": 2},
        GPU0: {"CUSTOM_VGPU": 2},
    }
    assert got["consumer_generation"] == 2
    usages = {
        rp: ok(live.admin.get(f"/resource_providers/{rp}/usages", headers=V))["usages"]
        for rp in (CN, GPU0, GPU1)
    }
    assert usages == {CN: {"VCPU": 2}, GPU0: {"CUSTOM_VGPU": 2}, GPU1: {"CUSTOM_VGPU": 1}}
    assert audit(live.lm.store) == []
    # Placement's three steps (interim inventories, allocations, final inventories) each
    # move the generation: a client that cached one expects the same.
    assert {rp: _generation(live, rp) - g for rp, g in before.items()} == {CN: 3, GPU0: 3, GPU1: 3}


def test_an_interim_inventory_below_use_passes_when_the_allocations_fit_in_the_end(
    live: Live,
) -> None:
    """The root's VCPU shrinks to 1 while C's two move to a child that gains VCPU: no
    moment of the reshape may be judged on its own, only where it ends."""
    _setup(live)
    body = _reshape(live)
    body["inventories"][CN]["inventories"] = {"VCPU": {"total": 1}}
    body["inventories"][GPU0]["inventories"] = {"CUSTOM_VGPU": {"total": 2}, "VCPU": {"total": 2}}
    body["allocations"][C] = _consumer({GPU0: {"VCPU": 2, "CUSTOM_VGPU": 2}}, 1)
    answer = live.admin.post("/reshaper", json=body, headers=V)
    assert answer.status_code == 204, answer.text
    usages = ok(live.admin.get(f"/resource_providers/{GPU0}/usages", headers=V))["usages"]
    assert usages == {"VCPU": 2, "CUSTOM_VGPU": 2}
    assert ok(live.admin.get(f"/resource_providers/{CN}/usages", headers=V))["usages"] == {
        "VCPU": 0
    }
    assert audit(live.lm.store) == []


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        # D's VGPU stays on the root, whose VGPU inventory goes.
        ("leave_d_behind", 409, "CUSTOM_VGPU: cannot remove, 1 is allocated"),
        ("stale_generation", 409, "generation conflict on host cn-pgpu0: actual: 0, given: 5"),
        # C's VCPU is rewritten on a root shrunk below it.
        ("root_vcpu_below_c", 409, "Unable to allocate inventory"),
        ("too_much_on_gpu0", 409, "exceed the capacity"),
        ("unknown_key", 400, "Additional properties are not allowed"),
    ],
)
def test_a_refused_reshape_changes_nothing(
    live: Live, change: str, status: int, words: str
) -> None:
    _setup(live)
    body = _reshape(live)
    if change == "leave_d_behind":
        del body["allocations"][D]
    elif change == "stale_generation":
        body["inventories"][GPU0]["resource_provider_generation"] += 5
    elif change == "root_vcpu_below_c":
        body["inventories"][CN]["inventories"] = {"VCPU": {"total": 1}}
    elif change == "too_much_on_gpu0":
        body["allocations"][C] = _consumer({CN: {"VCPU": 2}, GPU0: {"CUSTOM_VGPU": 3}}, 1)
    else:
        body["colour"] = "blue"
    before = table_rows(live.lm)
    answer = live.admin.post("/reshaper", json=body, headers=V)
    assert answer.status_code == status and words in answer.json()["detail"], answer.text
    assert table_rows(live.lm) == before


def test_a_vms_consumer_is_not_reshaped_and_old_versions_have_no_reshaper(live: Live) -> None:
    _setup(live)
    build_cluster(live.admin, hosts=1)
    vm = ok(live.admin.post("/vms", json={"name": "v", "flavor": "small"}), 201)["uuid"]
    ok(live.admin.post("/schedule", json={"requests": [{"vms": [vm]}]}))
    body = _reshape(live)
    body["allocations"][vm] = _consumer({GPU1: {"CUSTOM_VGPU": 1}}, 1)
    before = table_rows(live.lm)
    refused = live.admin.post("/reshaper", json=body, headers=V)
    assert refused.status_code == 409 and "is a loadmaster VM" in refused.json()["detail"]
    assert table_rows(live.lm) == before
    old = {"OpenStack-API-Version": "placement 1.29"}
    assert live.admin.post("/reshaper", json=_reshape(live), headers=old).status_code == 404
    assert live.reader.post("/reshaper", json=_reshape(live), headers=V).status_code == 403
