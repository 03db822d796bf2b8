"""Issue #25's findings, each as Placement 16 answers them: allocation candidates on a
tree with NUMA children and a sharing provider (traits and aggregates judged on the
providers a candidate allocates from, every combination, no repeats), and the smaller
differences (consumer generations per provider, provider generations, orders, usages)."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import os_resource_classes
from api_helpers import Live, ok

V = {"OpenStack-API-Version": "placement 1.39"}
AGG = str(uuid.uuid4())
IDS = {name: str(uuid.uuid4()) for name in ("cn1", "numa0", "numa1", "ss", "cn2")}
NAME = {u: n for n, u in IDS.items()}
# name: (parent, inventories, traits, aggregates), created in this order.
TREE: dict[str, tuple[str | None, dict[str, int], list[str], list[str]]] = {
    "cn1": (None, {}, [], [AGG]),
    "numa0": ("cn1", {"VCPU": 8, "MEMORY_MB": 4096}, [], []),
    "numa1": ("cn1", {"VCPU": 8, "MEMORY_MB": 4096}, ["HW_CPU_X86_AVX512F"], []),
    "ss": (None, {"DISK_GB": 1000}, ["MISC_SHARES_VIA_AGGREGATE", "STORAGE_DISK_SSD"], [AGG]),
    "cn2": (
        None,
        {"VCPU": 8, "MEMORY_MB": 4096, "DISK_GB": 500},
        ["STORAGE_DISK_SSD"],
        [AGG],
    ),
}


def _build(live: Live) -> None:
    http = live.admin
    for name, (parent, inventories, traits, aggregates) in TREE.items():
        body: dict[str, Any] = {"name": name, "uuid": IDS[name]}
        if parent is not None:
            body["parent_provider_uuid"] = IDS[parent]
        ok(http.post("/resource_providers", json=body, headers=V))
        path = f"/resource_providers/{IDS[name]}"
        generation = 0
        if inventories:
            inv = {c: {"total": t} for c, t in inventories.items()}
            body = {"resource_provider_generation": generation, "inventories": inv}
            generation = ok(http.put(f"{path}/inventories", json=body, headers=V))[
                "resource_provider_generation"
            ]
        if traits:
            body = {"resource_provider_generation": generation, "traits": traits}
            generation = ok(http.put(f"{path}/traits", json=body, headers=V))[
                "resource_provider_generation"
            ]
        if aggregates:
            body = {"resource_provider_generation": generation, "aggregates": aggregates}
            ok(http.put(f"{path}/aggregates", json=body, headers=V))


def _candidates(live: Live, **params: Any) -> list[dict[str, dict[str, int]]]:
    """Each candidate as provider name -> amounts."""
    found = ok(live.admin.get("/allocation_candidates", params=params, headers=V))
    return [
        {NAME[u]: a["resources"] for u, a in c["allocations"].items()}
        for c in found["allocation_requests"]
    ]


def _providers_of(candidates: list[dict[str, dict[str, int]]]) -> Counter[frozenset[str]]:
    return Counter(frozenset(c) for c in candidates)


def test_a_required_trait_is_judged_on_the_numa_node_allocated_from(live: Live) -> None:
    _build(live)
    found = _candidates(live, resources="VCPU:1", required="HW_CPU_X86_AVX512F")
    assert found == [{"numa1": {"VCPU": 1}}]


def test_a_forbidden_trait_on_a_sibling_does_not_drop_the_tree(live: Live) -> None:
    _build(live)
    found = _candidates(live, resources="VCPU:1", required="!HW_CPU_X86_AVX512F")
    assert _providers_of(found) == Counter([frozenset({"numa0"}), frozenset({"cn2"})])


def test_a_trait_of_the_sharing_provider_counts_when_it_is_allocated_from(live: Live) -> None:
    _build(live)
    found = _candidates(
        live, resources="VCPU:1,MEMORY_MB:512,DISK_GB:10", required="STORAGE_DISK_SSD"
    )
    # cn1's tree: VCPU and MEMORY_MB each from either NUMA node, disk from ss (4); cn2:
    # its own disk or ss's (2).
    assert len(found) == 6
    assert all("ss" in c or "cn2" in c for c in found)
    shared = _candidates(live, resources="VCPU:1,DISK_GB:10", required="MISC_SHARES_VIA_AGGREGATE")
    assert _providers_of(shared) == Counter(
        [frozenset({"numa0", "ss"}), frozenset({"numa1", "ss"}), frozenset({"cn2", "ss"})]
    )


def test_a_sharing_provider_reached_from_two_trees_is_listed_once(live: Live) -> None:
    _build(live)
    found = _candidates(live, resources="DISK_GB:10", member_of=AGG)
    assert _providers_of(found) == Counter([frozenset({"ss"}), frozenset({"cn2"})])


def test_every_combination_of_providers_is_a_candidate(live: Live) -> None:
    _build(live)
    found = _candidates(live, resources="VCPU:1,MEMORY_MB:512")
    assert len(found) == 5 and len({repr(c) for c in found}) == 5
    assert {"numa0": {"VCPU": 1}, "numa1": {"MEMORY_MB": 512}} in found
    # ``limit`` keeps the first ones of the same order.
    assert _candidates(live, resources="VCPU:1,MEMORY_MB:512", limit=2) == found[:2]


def test_provider_allocations_show_consumer_generations_from_1_28(live: Live) -> None:
    _build(live)
    consumer = str(uuid.uuid4())
    body = {
        "allocations": {IDS["cn2"]: {"resources": {"VCPU": 1}}},
        "project_id": "p",
        "user_id": "u",
        "consumer_generation": None,
        "consumer_type": "INSTANCE",
    }
    ok(live.admin.put(f"/allocations/{consumer}", json=body, headers=V), 204)
    path = f"/resource_providers/{IDS['cn2']}/allocations"
    held = ok(live.admin.get(path, headers=V))["allocations"][consumer]
    assert held == {"resources": {"VCPU": 1}, "consumer_generation": 1}
    old = {"OpenStack-API-Version": "placement 1.27"}
    assert ok(live.admin.get(path, headers=old))["allocations"][consumer] == {
        "resources": {"VCPU": 1}
    }


def _generation(live: Live, name: str) -> int:
    found = ok(live.admin.get(f"/resource_providers/{IDS[name]}", headers=V))
    return int(found["generation"])


def test_two_consumers_on_one_provider_move_its_generation_once(live: Live) -> None:
    _build(live)
    before = _generation(live, "cn2")
    body = {
        str(uuid.uuid4()): {
            "allocations": {IDS["cn2"]: {"resources": {"VCPU": 1}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        }
        for _ in range(2)
    }
    ok(live.admin.post("/allocations", json=body, headers=V), 204)
    assert _generation(live, "cn2") == before + 1


def test_the_same_traits_again_move_no_generation(live: Live) -> None:
    _build(live)
    before = _generation(live, "cn2")
    body = {"resource_provider_generation": before, "traits": ["STORAGE_DISK_SSD"]}
    answer = ok(live.admin.put(f"/resource_providers/{IDS['cn2']}/traits", json=body, headers=V))
    assert answer["resource_provider_generation"] == before == _generation(live, "cn2")


def test_classes_and_providers_come_in_placements_order(live: Live) -> None:
    for name in ("CUSTOM_B", "CUSTOM_A"):
        assert live.admin.put(f"/resource_classes/{name}", headers=V).status_code == 201
    names = [
        c["name"] for c in ok(live.admin.get("/resource_classes", headers=V))["resource_classes"]
    ]
    assert names == [*os_resource_classes.STANDARDS, "CUSTOM_B", "CUSTOM_A"]
    for name in ("zeta", "alpha"):
        ok(live.admin.post("/resource_providers", json={"name": name}, headers=V))
    listed = ok(live.admin.get("/resource_providers", headers=V))["resource_providers"]
    assert [p["name"] for p in listed] == ["zeta", "alpha"]


def test_provider_usages_carry_only_placements_keys(live: Live) -> None:
    _build(live)
    found = ok(live.admin.get(f"/resource_providers/{IDS['cn2']}/usages", headers=V))
    assert set(found) == {"resource_provider_generation", "usages"}
    split = ok(live.admin.get("/hosts/cn2/usages"))["classes"]
    assert split["VCPU"] == {"capacity": 8, "active": 0, "pending": 0, "used": 0, "free": 8}
