"""Placement's granular request groups in ``GET /allocation_candidates``: numbered groups
each served by one provider (1.25), ``group_policy``, ``root_required`` (1.35) and
``same_subtree`` (1.36), over nested trees built through Placement's own API."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from api_helpers import Live, ok

V = {"OpenStack-API-Version": "placement 1.39"}
IDS = {name: str(uuid.uuid4()) for name in ("cnA", "numa0", "pf0", "numa1", "pf1", "cnB", "pfB")}
TREE = {  # name: (parent, inventories, traits)
    "cnA": (None, {"VCPU": 8, "MEMORY_MB": 4096}, ["HW_CPU_X86_AVX2"]),
    "numa0": ("cnA", {"CUSTOM_NUMA_MEM": 10}, []),
    "pf0": ("numa0", {"SRIOV_NET_VF": 2}, ["CUSTOM_PHYSNET_A"]),
    "numa1": ("cnA", {"CUSTOM_NUMA_MEM": 10}, []),
    "pf1": ("numa1", {"SRIOV_NET_VF": 2}, ["CUSTOM_PHYSNET_A"]),
    "cnB": (None, {"VCPU": 8, "MEMORY_MB": 4096}, []),
    "pfB": ("cnB", {"SRIOV_NET_VF": 8}, ["CUSTOM_PHYSNET_B"]),
}
NAME = {u: n for n, u in IDS.items()}


def _build(live: Live) -> None:
    http = live.admin
    assert http.put("/resource_classes/CUSTOM_NUMA_MEM", headers=V).status_code == 201
    for trait in ("CUSTOM_PHYSNET_A", "CUSTOM_PHYSNET_B"):
        assert http.put(f"/traits/{trait}", headers=V).status_code == 201
    for name, (parent, inventories, traits) in TREE.items():
        body = {"name": name, "uuid": IDS[name]}
        if parent is not None:
            body["parent_provider_uuid"] = IDS[parent]
        ok(http.post("/resource_providers", json=body, headers=V))
        inv = {c: {"total": t} for c, t in inventories.items()}
        ok(
            http.put(
                f"/resource_providers/{IDS[name]}/inventories",
                json={"resource_provider_generation": 0, "inventories": inv},
                headers=V,
            )
        )
        if traits:
            ok(
                http.put(
                    f"/resource_providers/{IDS[name]}/traits",
                    json={"resource_provider_generation": 1, "traits": traits},
                    headers=V,
                )
            )


def _candidates(live: Live, version: str = "1.39", **params: Any) -> list[dict[str, Any]]:
    answer = live.admin.get(
        "/allocation_candidates",
        params=params,
        headers={"OpenStack-API-Version": f"placement {version}"},
    )
    requests: list[dict[str, Any]] = ok(answer)["allocation_requests"]
    return requests


def _named(candidate: dict[str, Any]) -> dict[str, Any]:
    return {
        "allocations": {NAME[u]: a["resources"] for u, a in candidate["allocations"].items()},
        "mappings": {s: [NAME[u] for u in us] for s, us in candidate["mappings"].items()},
    }


def test_a_numbered_group_comes_from_one_provider_with_its_traits(live: Live) -> None:
    _build(live)
    found = _candidates(
        live, resources="VCPU:1", resources1="SRIOV_NET_VF:1", required1="CUSTOM_PHYSNET_A"
    )
    # Each of cnA's PFs on physnet A, in creation order (pfB's physnet is B).
    assert [_named(c) for c in found] == [
        {
            "allocations": {"cnA": {"VCPU": 1}, pf: {"SRIOV_NET_VF": 1}},
            "mappings": {"": ["cnA"], "1": [pf]},
        }
        for pf in ("pf0", "pf1")
    ]
    physnet_b = _candidates(live, resources1="SRIOV_NET_VF:3", required1="CUSTOM_PHYSNET_B")
    assert [_named(c)["mappings"] for c in physnet_b] == [{"1": ["pfB"]}]
    # No single PF of cnA has 3 VFs, though the tree has 4.
    assert _candidates(live, resources1="SRIOV_NET_VF:3", required1="CUSTOM_PHYSNET_A") == []


def test_group_policy_isolate_keeps_groups_on_different_providers(live: Live) -> None:
    _build(live)
    two = {
        "resources1": "SRIOV_NET_VF:1",
        "required1": "CUSTOM_PHYSNET_A",
        "resources2": "SRIOV_NET_VF:1",
        "required2": "CUSTOM_PHYSNET_A",
    }
    shared = [_named(c) for c in _candidates(live, group_policy="none", **two)]
    assert [c["mappings"] for c in shared] == [
        {"1": [a], "2": [b]} for a in ("pf0", "pf1") for b in ("pf0", "pf1")
    ]
    assert shared[0]["allocations"] == {"pf0": {"SRIOV_NET_VF": 2}}
    isolated = _candidates(live, group_policy="isolate", **two)
    assert [_named(c)["mappings"] for c in isolated] == [
        {"1": ["pf0"], "2": ["pf1"]},
        {"1": ["pf1"], "2": ["pf0"]},
    ]
    refused = live.admin.get("/allocation_candidates", params=two, headers=V)
    assert refused.status_code == 400
    assert '"group_policy" parameter is required' in refused.json()["detail"]


def test_root_required_judges_the_roots_traits(live: Live) -> None:
    _build(live)
    roots = {
        tuple(sorted(_named(c)["allocations"]))
        for c in _candidates(live, resources="VCPU:1", root_required="HW_CPU_X86_AVX2")
    }
    assert roots == {("cnA",)}
    others = _candidates(live, resources="VCPU:1", root_required="!HW_CPU_X86_AVX2")
    assert [list(_named(c)["allocations"]) for c in others] == [["cnB"]]
    too_old = live.admin.get(
        "/allocation_candidates",
        params={"resources": "VCPU:1", "root_required": "HW_CPU_X86_AVX2"},
        headers={"OpenStack-API-Version": "placement 1.34"},
    )
    assert too_old.status_code == 400 and "root_required" in too_old.text


def test_same_subtree_and_pending_use_steer_the_numa_node(live: Live) -> None:
    _build(live)
    # A plain consumer holds one of pf0's two VFs: a group of 2 VFs now fits only pf1,
    # and the NUMA memory must come from pf1's node.
    body = {
        "allocations": {IDS["pf0"]: {"resources": {"SRIOV_NET_VF": 1}}},
        "project_id": "p",
        "user_id": "u",
        "consumer_generation": None,
        "consumer_type": "INSTANCE",
    }
    assert live.admin.put(f"/allocations/{uuid.uuid4()}", json=body, headers=V).status_code == 204
    params = {
        "resources_MEM": "CUSTOM_NUMA_MEM:5",
        "resources_NET": "SRIOV_NET_VF:2",
        "required_NET": "CUSTOM_PHYSNET_A",
        "group_policy": "none",
    }
    anywhere = _candidates(live, **params)
    assert [_named(c)["mappings"] for c in anywhere] == [
        {"_MEM": [numa], "_NET": ["pf1"]} for numa in ("numa0", "numa1")
    ]
    [together] = _candidates(live, same_subtree="_MEM,_NET", **params)
    assert _named(together)["mappings"] == {"_MEM": ["numa1"], "_NET": ["pf1"]}
    unknown = live.admin.get(
        "/allocation_candidates", params={**params, "same_subtree": "_MEM,_X"}, headers=V
    )
    assert unknown.status_code == 400 and "_X" in unknown.text


@pytest.mark.parametrize(
    ("version", "params", "words"),
    [
        ("1.24", {"resources1": "VCPU:1"}, "resources1"),
        ("1.32", {"resources_A": "VCPU:1"}, "resources_A"),
        ("1.39", {"required1": "CUSTOM_PHYSNET_A"}, "at least one resources"),
        ("1.35", {"required1": "CUSTOM_PHYSNET_A"}, "orphaned traits keys: required1"),
        ("1.35", {"resources": "VCPU:1", "in_tree1": IDS["cnA"]}, "must specify resources"),
        ("1.39", {"resources1": "VCPU:1", "group_policy": "sometimes"}, "sometimes"),
        ("1.39", {"required": "HW_CPU_X86_AVX2"}, "at least one resources"),
        ("1.35", {}, "At least one request group"),
        ("1.39", {"resources": "VCPU:1", "colour": "blue"}, "colour"),
    ],
)
def test_malformed_groups_are_refused_naming_the_parameter(
    live: Live, version: str, params: dict[str, str], words: str
) -> None:
    answer = live.admin.get(
        "/allocation_candidates",
        params=params,
        headers={"OpenStack-API-Version": f"placement {version}"},
    )
    assert answer.status_code == 400 and words in answer.text, answer.text
