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
    filters_and_inventory_options(url)


def filters_and_inventory_options(url: str) -> None:
    """The list filters, and inventory set's --amend, --dry-run and --aggregate."""
    (
        by_uuid,
        member,
        any_trait,
        both_traits,
        not_fast,
        associated,
        amended,
        dry,
        after_dry,
        by_aggregate,
        _,
        klass,
    ) = run(
        url,
        ["resource", "provider", "list", "--uuid", RP2, *J],
        ["resource", "provider", "list", "--member-of", AGG, *J],
        # At 1.39 a comma means any of them (osc sends required=in:A,B).
        ["resource", "provider", "list", "--required", "CUSTOM_FAST,HW_CPU_X86_SSE", *J],
        [
            "resource",
            "provider",
            "list",
            "--required",
            "CUSTOM_FAST",
            "--required",
            "HW_CPU_X86_SSE",
            *J,
        ],
        ["resource", "provider", "list", "--forbidden", "CUSTOM_FAST", *J],
        ["trait", "list", "--associated", *J],
        [
            "resource",
            "provider",
            "inventory",
            "set",
            RP2,
            "--amend",
            "--resource",
            "DISK_GB=50",
            "--resource",
            "VCPU:reserved=1",
            *J,
        ],
        ["resource", "provider", "inventory", "set", RP2, "--dry-run", "--resource", "VCPU=1", *J],
        ["resource", "provider", "inventory", "show", RP2, "VCPU", *J],
        # The positional uuid is an aggregate's: every provider in it gets the change.
        [
            "resource",
            "provider",
            "inventory",
            "set",
            AGG,
            "--aggregate",
            "--amend",
            "--resource",
            "DISK_GB=60",
            *J,
        ],
        ["resource", "class", "set", "CUSTOM_LICENCE"],  # exists: 204, nothing changes
        ["resource", "class", "show", "CUSTOM_LICENCE", *J],
    )
    assert [p["uuid"] for p in by_uuid] == [RP2] == [p["uuid"] for p in member]
    assert [p["uuid"] for p in any_trait] == [RP1] and both_traits == []
    assert sorted(p["uuid"] for p in not_fast) == sorted([RP2, CHILD])
    assert [t["name"] for t in associated] == ["CUSTOM_FAST", "HW_CPU_X86_AVX2"]
    assert {i["resource_class"]: (i["total"], i["reserved"]) for i in amended} == {
        "VCPU": (8, 1),
        "CUSTOM_LICENCE": (2, 0),
        "DISK_GB": (50, 0),
    }
    assert [(i["resource_class"], i["total"]) for i in dry] == [("VCPU", 1)]
    assert (after_dry["total"], after_dry["reserved"]) == (8, 1)  # a dry run writes nothing
    assert {(i["resource_provider"], i["resource_class"], i["total"]) for i in by_aggregate} == {
        (RP2, "VCPU", 8),
        (RP2, "CUSTOM_LICENCE", 2),
        (RP2, "DISK_GB", 60),
    }
    assert klass["name"] == "CUSTOM_LICENCE"


def candidates_allocations_and_usages(url: str) -> None:
    fast, licensed, none_left, shared, apart = run(
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
        *[
            [
                "allocation",
                "candidate",
                "list",
                "--group",
                "1",
                "--resource",
                "VCPU=2",
                "--group",
                "2",
                "--resource",
                "MEMORY_MB=512",
                "--group-policy",
                policy,
                *J,
            ]
            for policy in ("none", "isolate")
        ],
    )
    assert [c["resource provider"] for c in fast] == [RP1]
    assert [c["resource provider"] for c in licensed] == [RP2]
    assert none_left == []  # RP2 has no memory, RP1 has the forbidden trait
    # Both numbered groups fit only RP1: together under "none", never under "isolate".
    assert [(c["resource provider"], c["allocation"]) for c in shared] == [
        (RP1, "VCPU=2,MEMORY_MB=512")
    ]
    assert apart == []

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
        ["resource", "provider", "create", "rp-one-numa0", "--parent-provider", RP1, *J],
        ["resource", "provider", "inventory", "set", RP2, "--resource", "VCPU=4", *J],
        [
            "resource",
            "provider",
            "allocation",
            "set",
            CONSUMER,
            "--allocation",
            f"rp={RP2},VCPU=3",
            "--project-id",
            PROJECT,
            "--user-id",
            USER,
            "--consumer-type",
            "INSTANCE",
            *J,
        ],
    )
    in_use = f"Inventory for 'VCPU' on resource provider '{RP2}' in use."
    cases = [
        (
            ["resource", "provider", "show", missing, *J],
            f"No resource provider with uuid {missing} found (HTTP 404)",
        ),
        (
            ["resource", "provider", "inventory", "set", RP1, "--resource", "VCPU=-1", *J],
            "-1 is less than the minimum of 1",
        ),
        (
            ["resource", "class", "create", "NOT_CUSTOM"],
            "'NOT_CUSTOM' does not match '^CUSTOM_[A-Z0-9_]+$'",
        ),
        (
            [
                "resource",
                "provider",
                "inventory",
                "class",
                "set",
                RP2,
                "DISK_GB",
                "--total",
                "1",
                *J,
            ],
            "No inventory record with resource class DISK_GB",
        ),
        # nova's report client reads the in-use code behind these words (the SDK test checks it)
        (["resource", "provider", "inventory", "delete", RP2, "--resource-class", "VCPU"], in_use),
        (["resource", "provider", "inventory", "set", RP2, "--resource", "DISK_GB=1", *J], in_use),
        (["resource", "provider", "inventory", "delete", RP2], in_use),
        (
            ["resource", "provider", "delete", RP2],
            f"Unable to delete resource provider {RP2}: Resource provider has allocations.",
        ),
        (
            ["resource", "provider", "delete", RP1],
            f"Unable to delete parent resource provider {RP1}: It has child resource providers.",
        ),
        (
            ["resource", "provider", "create", "rp-one", *J],
            "Conflicting resource provider name: rp-one already exists",
        ),
        (
            [
                "resource",
                "provider",
                "allocation",
                "set",
                str(uuid.uuid4()),
                "--allocation",
                f"rp={RP2},VCPU=2",
                "--project-id",
                PROJECT,
                "--user-id",
                USER,
                "--consumer-type",
                "INSTANCE",
                *J,
            ],
            "Unable to allocate inventory: The requested amount would exceed the capacity.",
        ),
        (
            [
                "resource",
                "provider",
                "aggregate",
                "set",
                RP2,
                "--aggregate",
                AGG,
                "--generation",
                "0",
                *J,
            ],
            "Resource provider's generation already changed. Please update the generation "
            "and try again.",
        ),
        (
            [
                "allocation",
                "candidate",
                "list",
                "--resource",
                "VCPU=1",
                "--required",
                "CUSTOM_NOT_A_TRAIT",
                *J,
            ],
            "No such trait(s): CUSTOM_NOT_A_TRAIT. (HTTP 400)",
        ),
        (
            ["trait", "delete", "CUSTOM_NOT_A_TRAIT"],
            "No such trait(s): CUSTOM_NOT_A_TRAIT. (HTTP 404)",
        ),
        (
            ["resource", "class", "delete", "CUSTOM_NOT_A_CLASS"],
            "No such resource class CUSTOM_NOT_A_CLASS. (HTTP 404)",
        ),
    ]
    results = osc(url, ADMIN, *[argv for argv, _ in cases])
    for result, (_, expected) in zip(results, cases, strict=True):
        assert result["code"] == 1 and expected in result["stderr"], result
        assert "'errors'" not in result["stderr"]
    refused = osc(url, "reader-token", ["resource", "class", "create", "CUSTOM_NOPE"])[0]
    assert refused["code"] == 1 and "(HTTP 403)" in refused["stderr"]
    # Nothing refused changed anything.
    [inventory, usage] = run(
        url,
        ["resource", "provider", "inventory", "list", RP2, *J],
        ["resource", "provider", "usage", "show", RP2, *J],
    )
    assert [(i["resource_class"], i["total"]) for i in inventory] == [("VCPU", 4)]
    assert [(u["resource_class"], u["usage"]) for u in usage] == [("VCPU", 3)]


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
    # The calls meant to fail, each with Placement's exception, words and code.
    refused = {
        "set_inventories_stale_generation": (
            "ConflictException",
            "Resource provider's generation already changed",
            "placement.concurrent_update",
        ),
        "candidates_unknown_trait": (
            "BadRequestException",
            "No such trait(s): CUSTOM_NOT_A_TRAIT.",
            "placement.undefined_code",
        ),
        "delete_inventory_in_use": (
            "ConflictException",
            f"Inventory for 'VCPU' on resource provider '{ids['rp']}' in use.",
            "placement.inventory.inuse",
        ),
        "delete_provider_in_use": (
            "ConflictException",
            f"Unable to delete resource provider {ids['rp']}: Resource provider has allocations.",
            "placement.resource_provider.inuse",
        ),
        "get_deleted": (
            "NotFoundException",
            f"No resource provider with uuid {ids['other']} found",
            "placement.undefined_code",
        ),
        "delete_missing_trait": (
            "NotFoundException",
            "No such trait(s): CUSTOM_SDK_TRAIT.",
            "placement.undefined_code",
        ),
    }
    assert set(failed) == set(refused), failed
    for name, (exception, words, code) in refused.items():
        assert failed[name].startswith(exception) and words in failed[name], failed[name]
        assert steps[name]["code"] == code, (name, steps[name])

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
    assert value("get_put_class")["name"] == "CUSTOM_SDK_PUT"
    assert {
        i["resource_class"]: (i["total"], i["reserved"]) for i in value("other_inventories")
    } == {
        "VCPU": (4, 0),
        "MEMORY_MB": (4096, 512),
    }
    assert value("set_resource_provider_inventories")["generation"] == 1
    assert value("update_resource_provider_inventory")["reserved"] == 1
    assert value("update_resource_provider_inventory")["total"] == 10
    assert [t["name"] for t in value("traits")] == ["CUSTOM_SDK_TRAIT"]
    assert sorted(value("get_resource_provider_trait")["traits"]) == [
        "CUSTOM_SDK_TRAIT",
        "HW_CPU_X86_AVX2",
    ]
    assert value("get_resource_provider_aggregates")["aggregates"] == [ids["agg"]]
    assert value("fetch_resource_provider_aggregates")["aggregates"] == [ids["agg"]]
    # VCPU: 10 total, 1 reserved, ratio 1.0 again (the update's PUT left it out): 9 fit.
    for name, wanted in [
        ("providers_member_of", [ids["rp"]]),
        ("providers_with_room", [ids["rp"]]),
        ("providers_required", [ids["other"]]),
    ]:
        assert [p["id"] for p in value(name)] == wanted, name
    assert [t["name"] for t in value("traits_associated")] == [
        "CUSTOM_SDK_TRAIT",
        "HW_CPU_X86_AVX2",
    ]
    [limited] = value("candidates_member_of_limit")
    assert limited["allocations"] == {ids["rp"]: {"resources": {"VCPU": 1}}}
    [candidate] = value("allocation_candidates")
    assert candidate["allocations"] == {ids["rp"]: {"resources": {"VCPU": 2}}}
    allocation = value("get_allocation")
    assert allocation["allocations"][ids["rp"]]["resources"] == {"VCPU": 2, "CUSTOM_SDK": 1}
    assert (allocation["project_id"], allocation["consumer_type"]) == (ids["project"], "INSTANCE")
    assert value("fetch_resource_provider_usages")["usages"] == {"VCPU": 2, "CUSTOM_SDK": 1}
    assert (
        value("usages")
        == value("usages_of_user")
        == [
            {
                "consumer_type": "INSTANCE",
                "consumer_count": 1,
                "resources": {"VCPU": 2, "CUSTOM_SDK": 1},
                "id": None,
                "name": None,
            }
        ]
    )
    updated = value("get_updated_allocation")
    assert {p: a["resources"] for p, a in updated["allocations"].items()} == {
        ids["rp"]: {"VCPU": 1},
        ids["other"]: {"MEMORY_MB": 1024},
    }
    assert (updated["consumer_generation"], updated["consumer_type"]) == (2, "MIGRATION")
    assert value("find_deleted") is None


def at(version: str, *argv: str) -> list[str]:
    return ["--os-placement-api-version", version, *argv]


def test_older_microversions_as_osc_speaks_them(url: str) -> None:
    """osc-placement changes its requests and its columns with the microversion asked
    for: each command at an older version it supports, all in one driver process (so each
    command's own version must reach the server, not the first one's)."""
    rp, child, other, first, second, agg = (str(uuid.uuid4()) for _ in range(6))
    owner = ["--project-id", PROJECT, "--user-id", USER]
    (
        created,
        _,
        _,
        inventory,
        _,
        _,
        ownerless,
        owned,
        shown,
        usage,
        too_old,
        summary,
        limited,
        with_traits,
        aggregates,
        by_aggregate,
        room,
        no_room,
        old_show,
        new_show,
        tree,
        in_aggregate,
        _,
        klass,
        associated,
        unset,
        after_unset,
        _,
        child_inventory,
        moved,
    ) = osc(
        url,
        ADMIN,
        at("1.0", "resource", "provider", "create", "old-rp", "--uuid", rp, *J),
        at("1.14", "resource", "provider", "create", "old-child", "--uuid", child,
           "--parent-provider", rp, *J),
        at("1.0", "resource", "provider", "create", "old-other", "--uuid", other, *J),
        at("1.0", "resource", "provider", "inventory", "set", rp, "--resource", "VCPU=8",
           "--resource", "DISK_GB=100", *J),
        at("1.0", "resource", "provider", "inventory", "set", child, "--resource", "VCPU=2", *J),
        at("1.6", "resource", "provider", "trait", "set", rp, "--trait", "HW_CPU_X86_AVX2", *J),
        # Before 1.8 a consumer has no owner; before 1.12 the body is a list.
        at("1.0", "resource", "provider", "allocation", "set", first, "--allocation",
           f"rp={rp},VCPU=1", *J),
        at("1.8", "resource", "provider", "allocation", "set", second, "--allocation",
           f"rp={rp},VCPU=2", *owner, *J),
        at("1.12", "resource", "provider", "allocation", "show", second, *J),
        at("1.9", "resource", "usage", "show", PROJECT, *J),
        at("1.9", "allocation", "candidate", "list", "--resource", "VCPU=1", *J),
        at("1.10", "allocation", "candidate", "list", "--resource", "VCPU=1", *J),
        at("1.16", "allocation", "candidate", "list", "--resource", "VCPU=1", "--limit", "1", *J),
        at("1.17", "allocation", "candidate", "list", "--resource", "VCPU=1",
           "--required", "HW_CPU_X86_AVX2", *J),
        at("1.1", "resource", "provider", "aggregate", "set", rp, "--aggregate", agg, *J),
        at("1.3", "resource", "provider", "list", "--aggregate-uuid", agg, *J),
        at("1.4", "resource", "provider", "list", "--resource", "VCPU=5", *J),
        at("1.4", "resource", "provider", "list", "--resource", "VCPU=6", *J),
        at("1.13", "resource", "provider", "show", child, *J),
        at("1.14", "resource", "provider", "show", child, *J),
        at("1.14", "resource", "provider", "list", "--in-tree", child, *J),
        at("1.21", "allocation", "candidate", "list", "--resource", "DISK_GB=1",
           "--aggregate-uuid", agg, *J),
        at("1.7", "resource", "class", "set", "CUSTOM_OLD_STYLE"),
        at("1.2", "resource", "class", "show", "CUSTOM_OLD_STYLE", *J),
        at("1.6", "trait", "list", "--associated", *J),
        # 1.28 lets a consumer's last allocation go by a PUT with its generation.
        at("1.28", "resource", "provider", "allocation", "unset", second,
           "--resource-class", "VCPU", *J),
        at("1.12", "resource", "provider", "allocation", "show", second, *J),
        at("1.5", "resource", "provider", "inventory", "delete", child),
        at("1.5", "resource", "provider", "inventory", "list", child, *J),
        at("1.37", "resource", "provider", "set", child, "--name", "moved-child",
           "--parent-provider", other, *J),
    )  # fmt: skip

    def out(result: dict[str, Any]) -> Any:
        assert result["code"] == 0, f"{result['argv']}: {result['stderr'][-800:]}"
        return json.loads(result["stdout"]) if result["stdout"].strip() else None

    assert out(created) == {"uuid": rp, "name": "old-rp", "generation": 0}  # no tree before 1.14
    assert {i["resource_class"]: i["total"] for i in out(inventory)} == {"VCPU": 8, "DISK_GB": 100}
    assert [a["resources"] for a in out(ownerless)] == [{"VCPU": 1}]
    assert [a["resources"] for a in out(owned)] == [{"VCPU": 2}]
    assert "project-id" not in owned["stderr"]  # osc warns when 1.8 is not what it speaks
    assert [(a["project_id"], a["user_id"], a["resources"]) for a in out(shown)] == [
        (PROJECT, USER, {"VCPU": 2})
    ]
    assert out(usage) == [{"resource_class": "VCPU", "usage": 2}]  # no consumer types yet
    assert too_old["code"] == 1 and "requires at least version 1.10" in too_old["stderr"]
    # Before 1.27 a summary shows the requested classes only; before 1.29 no candidate
    # takes from two providers of one tree, but the child alone is one (Placement's
    # exclude_nested_providers).
    assert out(summary) == [
        {
            "#": 1,
            "allocation": "VCPU=1",
            "resource provider": rp,
            "inventory used/capacity": "VCPU=3/8",
        },
        {
            "#": 2,
            "allocation": "VCPU=1",
            "resource provider": child,
            "inventory used/capacity": "VCPU=0/2",
        },
    ]
    assert len(out(limited)) == 1
    assert [(c["resource provider"], c["traits"]) for c in out(with_traits)] == [
        (rp, "HW_CPU_X86_AVX2")
    ]
    assert [a["uuid"] for a in out(aggregates)] == [agg]
    assert [p["uuid"] for p in out(by_aggregate)] == [rp]
    assert [p["uuid"] for p in out(room)] == [rp] and out(no_room) == []
    assert "root_provider_uuid" not in out(old_show)
    assert (out(new_show)["root_provider_uuid"], out(new_show)["parent_provider_uuid"]) == (rp, rp)
    assert sorted(p["uuid"] for p in out(tree)) == sorted([rp, child])
    assert [c["resource provider"] for c in out(in_aggregate)] == [rp]
    assert out(klass) == {"name": "CUSTOM_OLD_STYLE"}
    assert [t["name"] for t in out(associated)] == ["HW_CPU_X86_AVX2"]
    assert out(unset) == [] and out(after_unset) == []
    assert out(child_inventory) == []
    assert (out(moved)["name"], out(moved)["root_provider_uuid"]) == ("moved-child", other)
