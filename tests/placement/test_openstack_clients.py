"""OpenStack's own clients work against loadmaster (issue #12): the everyday osc-placement
commands and openstacksdk's placement proxy, against a live ``loadmaster serve``, each
command's output checked. See openstack_clients.py for how they are installed and run."""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import start_server, stop_server
from openstack_clients import osc, sdk

# One worker runs them all: they share one client installation.
pytestmark = pytest.mark.xdist_group("openstack-clients")
ADMIN = "admin-token"
RP1, RP2, CHILD = (str(uuid.uuid4()) for _ in range(3))
AGG, CONSUMER, PROJECT, USER = (str(uuid.uuid4()) for _ in range(4))
J = ["-f", "json"]


@pytest.fixture
def url() -> Iterator[str]:
    """A server of its own for each test: a fresh database."""
    with tempfile.TemporaryDirectory(prefix="lm-osc-") as tmp:
        server, port = start_server(Path(tmp), [ADMIN], {"reader-token": "reader"})
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_server(server)


def run(url: str, *commands: list[str]) -> list[Any]:
    """Each command's parsed JSON output (None when it prints nothing); any failure fails
    the test with osc's own words."""
    results = osc(url, ADMIN, *commands)
    outputs = []
    for result in results:
        assert result["code"] == 0, f"{result['argv']}: {result['stderr'][-800:]}"
        outputs.append(json.loads(result["stdout"]) if result["stdout"].strip() else None)
    return outputs


def test_the_everyday_commands_one_after_another(url: str) -> None:
    """One operator's session: providers, inventories, classes, traits, aggregates, then
    candidates, allocations and usages on them, then taking it all down."""
    providers_inventories_classes_traits_and_aggregates(url)
    candidates_allocations_and_usages(url)
    teardown_deletes_what_was_made(url)


def providers_inventories_classes_traits_and_aggregates(url: str) -> None:
    created, _, child, renamed, named, tree = run(
        url,
        ["resource", "provider", "create", "rp-one", "--uuid", RP1, *J],
        ["resource", "provider", "create", "rp-two", "--uuid", RP2, *J],
        [
            "resource",
            "provider",
            "create",
            "rp-one-numa0",
            "--uuid",
            CHILD,
            "--parent-provider",
            RP1,
            *J,
        ],
        ["resource", "provider", "set", RP2, "--name", "rp-two-renamed", *J],
        ["resource", "provider", "list", "--name", "rp-two-renamed", *J],
        ["resource", "provider", "list", "--in-tree", RP1, *J],
    )
    assert created["uuid"] == RP1 and created["generation"] == 0
    assert child["parent_provider_uuid"] == RP1 and child["root_provider_uuid"] == RP1
    assert renamed["name"] == "rp-two-renamed" and [p["uuid"] for p in named] == [RP2]
    assert sorted(p["uuid"] for p in tree) == sorted([RP1, CHILD])

    _, klass, inventory, _, listed, shown, one_class = run(
        url,
        ["resource", "class", "create", "CUSTOM_LICENCE"],
        ["resource", "class", "show", "CUSTOM_LICENCE", *J],
        [
            "resource",
            "provider",
            "inventory",
            "set",
            RP1,
            "--resource",
            "VCPU=16",
            "--resource",
            "VCPU:allocation_ratio=4.0",
            "--resource",
            "MEMORY_MB=65536",
            "--resource",
            "MEMORY_MB:reserved=1024",
            *J,
        ],
        [
            "resource",
            "provider",
            "inventory",
            "set",
            RP2,
            "--resource",
            "VCPU=4",
            "--resource",
            "CUSTOM_LICENCE=2",
            *J,
        ],
        ["resource", "provider", "inventory", "list", RP1, *J],
        ["resource", "provider", "inventory", "show", RP1, "VCPU", *J],
        ["resource", "provider", "inventory", "class", "set", RP2, "VCPU", "--total", "8", *J],
    )
    assert klass["name"] == "CUSTOM_LICENCE"
    assert {i["resource_class"]: i["total"] for i in inventory} == {"VCPU": 16, "MEMORY_MB": 65536}
    assert {i["resource_class"] for i in listed} == {"VCPU", "MEMORY_MB"}
    assert shown["allocation_ratio"] == 4.0 and shown["total"] == 16
    assert one_class["total"] == 8

    _, trait, named_traits, _, rp_traits, generation = run(
        url,
        ["trait", "create", "CUSTOM_FAST"],
        ["trait", "show", "CUSTOM_FAST", *J],
        ["trait", "list", "--name", "in:CUSTOM_FAST,HW_CPU_X86_AVX2", *J],
        [
            "resource",
            "provider",
            "trait",
            "set",
            RP1,
            "--trait",
            "CUSTOM_FAST",
            "--trait",
            "HW_CPU_X86_AVX2",
            *J,
        ],
        ["resource", "provider", "trait", "list", RP1, *J],
        ["resource", "provider", "show", RP2, *J],
    )
    assert trait["name"] == "CUSTOM_FAST"
    assert sorted(t["name"] for t in named_traits) == ["CUSTOM_FAST", "HW_CPU_X86_AVX2"]
    assert sorted(t["name"] for t in rp_traits) == ["CUSTOM_FAST", "HW_CPU_X86_AVX2"]
    aggregates, listed_aggregates = run(
        url,
        [
            "resource",
            "provider",
            "aggregate",
            "set",
            RP2,
            "--aggregate",
            AGG,
            "--generation",
            str(generation["generation"]),
            *J,
        ],
        ["resource", "provider", "aggregate", "list", RP2, *J],
    )
    assert [a["uuid"] for a in aggregates] == [AGG] == [a["uuid"] for a in listed_aggregates]
    [old_style] = run(
        url,
        ["--os-placement-api-version", "1.1", "resource", "provider", "aggregate", "list", RP2, *J],
    )
    assert [a["uuid"] for a in old_style] == [AGG]


def candidates_allocations_and_usages(url: str) -> None:
    fast, licensed, none_left = run(
        url,
        [
            "allocation",
            "candidate",
            "list",
            "--resource",
            "VCPU=2",
            "--required",
            "CUSTOM_FAST",
            *J,
        ],
        [
            "allocation",
            "candidate",
            "list",
            "--resource",
            "CUSTOM_LICENCE=1",
            "--member-of",
            AGG,
            "--limit",
            "5",
            *J,
        ],
        [
            "allocation",
            "candidate",
            "list",
            "--resource",
            "VCPU=1",
            "--forbidden",
            "CUSTOM_FAST",
            "--member-of",
            AGG,
            "--resource",
            "MEMORY_MB=1",
            *J,
        ],
    )
    assert [c["resource provider"] for c in fast] == [RP1]
    assert [c["resource provider"] for c in licensed] == [RP2]
    assert none_left == []  # RP2 has no memory, RP1 has the forbidden trait

    allocated, shown, provider_usage, project, by_user, with_allocations, big = run(
        url,
        [
            "resource",
            "provider",
            "allocation",
            "set",
            CONSUMER,
            "--allocation",
            f"rp={RP1},VCPU=2,MEMORY_MB=512",
            "--allocation",
            f"rp={RP2},CUSTOM_LICENCE=1",
            "--project-id",
            PROJECT,
            "--user-id",
            USER,
            "--consumer-type",
            "INSTANCE",
            *J,
        ],
        ["resource", "provider", "allocation", "show", CONSUMER, *J],
        ["resource", "provider", "usage", "show", RP1, *J],
        ["resource", "usage", "show", PROJECT, *J],
        ["resource", "usage", "show", PROJECT, "--user-id", USER, *J],
        ["resource", "provider", "show", RP1, "--allocations", *J],
        ["resource", "provider", "list", "--resource", "VCPU=63", *J],
    )
    by_provider = {a["resource_provider"]: a["resources"] for a in shown}
    assert by_provider == {RP1: {"VCPU": 2, "MEMORY_MB": 512}, RP2: {"CUSTOM_LICENCE": 1}}
    assert {a["resource_provider"] for a in allocated} == {RP1, RP2}
    assert {u["resource_class"]: u["usage"] for u in provider_usage} == {
        "VCPU": 2,
        "MEMORY_MB": 512,
    }
    # At 1.38 usages come per consumer type; osc shows the type in its first column.
    for usage in (project, by_user):
        assert [(u["resource_class"], u["usage"]) for u in usage] == [
            ("INSTANCE", {"VCPU": 2, "MEMORY_MB": 512, "CUSTOM_LICENCE": 1, "consumer_count": 1})
        ]
    assert with_allocations["allocations"][CONSUMER]["resources"] == {"VCPU": 2, "MEMORY_MB": 512}
    assert big == []  # 64 VCPU of capacity, 2 used: 63 no longer fit

    unset, _ = run(
        url,
        ["resource", "provider", "allocation", "unset", CONSUMER, "--provider", RP2, *J],
        ["resource", "provider", "allocation", "delete", CONSUMER],
    )
    assert [a["resource_provider"] for a in unset] == [RP1]
    [left] = run(url, ["resource", "provider", "usage", "show", RP1, *J])
    assert {u["resource_class"]: u["usage"] for u in left} == {"VCPU": 0, "MEMORY_MB": 0}


def test_errors_show_placements_detail(url: str) -> None:
    missing = str(uuid.uuid4())
    run(
        url,
        ["resource", "provider", "create", "rp-one", "--uuid", RP1, *J],
        ["resource", "provider", "create", "rp-two", "--uuid", RP2, *J],
        ["resource", "provider", "inventory", "set", RP2, "--resource", "VCPU=4", *J],
    )
    results = osc(
        url,
        ADMIN,
        ["resource", "provider", "show", missing, *J],
        ["resource", "provider", "inventory", "set", RP1, "--resource", "VCPU=-1", *J],
        ["resource", "class", "create", "NOT_CUSTOM"],
        ["resource", "provider", "inventory", "class", "set", RP2, "DISK_GB", "--total", "1", *J],
    )
    words = [
        f"No resource provider with uuid {missing} found (HTTP 404)",
        "-1 is less than the minimum of 1",
        "'NOT_CUSTOM' does not match '^CUSTOM_[A-Z0-9_]+$'",
        "No inventory record with resource class DISK_GB",
    ]
    for result, expected in zip(results, words, strict=True):
        assert result["code"] == 1 and expected in result["stderr"], result
        assert "'errors'" not in result["stderr"]
    refused = osc(url, "reader-token", ["resource", "class", "create", "CUSTOM_NOPE"])[0]
    assert refused["code"] == 1 and "(HTTP 403)" in refused["stderr"]


def teardown_deletes_what_was_made(url: str) -> None:
    run(
        url,
        ["resource", "provider", "inventory", "delete", RP2, "--resource-class", "CUSTOM_LICENCE"],
        ["resource", "provider", "trait", "delete", RP1],
        ["trait", "delete", "CUSTOM_FAST"],
        ["resource", "class", "delete", "CUSTOM_LICENCE"],
        ["resource", "provider", "delete", CHILD],
        ["resource", "provider", "delete", RP2],
    )
    [providers, classes] = run(
        url, ["resource", "provider", "list", *J], ["resource", "class", "list", *J]
    )
    assert [p["uuid"] for p in providers] == [RP1]
    assert "CUSTOM_LICENCE" not in {c["name"] for c in classes}


def test_openstacksdk_placement_proxy(url: str) -> None:
    ids = {
        name: str(uuid.uuid4()) for name in ("rp", "other", "agg", "consumer", "project", "user")
    }
    steps = sdk(url, ADMIN, ids)
    failed = {name: step["error"] for name, step in steps.items() if not step["ok"]}
    assert failed == {"get_deleted": failed.get("get_deleted", "missing")}
    assert "NotFoundException" in failed["get_deleted"]

    def value(name: str) -> Any:
        return steps[name]["value"]

    assert value("get_resource_provider")["name"] == "sdk-rp"
    assert value("find_resource_provider")["id"] == ids["rp"]
    assert [p["id"] for p in value("resource_providers")] == [ids["other"]]
    assert "CUSTOM_SDK" in {c["name"] for c in value("resource_classes")}
    assert {
        i["resource_class"]: i["total"] for i in value("resource_provider_inventories")
    } == {  # before the update
        "VCPU": 8,
        "CUSTOM_SDK": 3,
    }
    assert value("update_resource_provider_inventory")["reserved"] == 1
    assert value("update_resource_provider_inventory")["total"] == 10
    assert [t["name"] for t in value("traits")] == ["CUSTOM_SDK_TRAIT"]
    assert sorted(value("get_resource_provider_trait")["traits"]) == [
        "CUSTOM_SDK_TRAIT",
        "HW_CPU_X86_AVX2",
    ]
    assert value("get_resource_provider_aggregates")["aggregates"] == [ids["agg"]]
    [candidate] = value("allocation_candidates")
    assert candidate["allocations"] == {ids["rp"]: {"resources": {"VCPU": 2}}}
    allocation = value("get_allocation")
    assert allocation["allocations"][ids["rp"]]["resources"] == {"VCPU": 2, "CUSTOM_SDK": 1}
    assert (allocation["project_id"], allocation["consumer_type"]) == (ids["project"], "INSTANCE")
    assert value("fetch_resource_provider_usages")["usages"] == {"VCPU": 2, "CUSTOM_SDK": 1}
    assert value("usages") == [
        {
            "consumer_type": "INSTANCE",
            "consumer_count": 1,
            "resources": {"VCPU": 2, "CUSTOM_SDK": 1},
            "id": None,
            "name": None,
        }
    ]
