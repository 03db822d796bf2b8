"""Runs inside the throw-away environment of OpenStack's clients (see openstack_clients.py).

``osc``: openstackclient commands, all in this one process (each ``openstack`` start costs
a second), from a JSON list of argv lists on stdin; one result per command.
``sdk``: a fixed walk through openstacksdk's placement proxy, step by step; each step's
value (resources as dicts) or error. The endpoint and token come from OS_ENDPOINT and
OS_TOKEN, as for osc."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any


def _forget_clients() -> None:
    """osc caches each plugin's client on the ClientManager class (osc_lib's ClientCache
    descriptors), so in one process every command would reuse the first one's client: its
    microversion and its token. Each command gets its own, as each ``openstack`` run does."""
    from osc_lib import clientmanager

    for attribute in vars(clientmanager.ClientManager).values():
        if isinstance(attribute, clientmanager.ClientCache):
            attribute._handle = None


def run_osc(commands: list[list[str]]) -> list[dict[str, Any]]:
    from openstackclient import shell

    results = []
    for argv in commands:
        _forget_clients()
        out, err = io.StringIO(), io.StringIO()
        started = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = shell.main(argv)
            except SystemExit as exc:
                code = exc.code
        results.append(
            {
                "argv": argv,
                "code": code,
                "stdout": out.getvalue(),
                "stderr": err.getvalue(),
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    return results


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return {k: _plain(v) for k, v in value.to_dict(computed=False).items() if k != "location"}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or hasattr(value, "__next__"):
        return [_plain(v) for v in value]
    return value


def run_sdk(ids: dict[str, str]) -> dict[str, Any]:
    import openstack
    from openstack.placement.v1.resource_provider_trait import ResourceProviderTrait

    conn = openstack.connection.Connection(
        auth_type="admin_token",
        auth={"endpoint": os.environ["OS_ENDPOINT"], "token": os.environ["OS_TOKEN"]},
        placement_api_version="1.39",
    )
    placement = conn.placement
    steps: dict[str, Any] = {}

    def step(name: str, call: Callable[[], Any]) -> Any:
        try:
            value = call()
            steps[name] = {"ok": True, "value": _plain(value)}
            return value
        except Exception as exc:  # the test reads what failed and why
            response = getattr(exc, "response", None)
            said = f" [{response.text[:500]}]" if response is not None else ""
            steps[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}{said}"}
            # Placement's error code, which clients such as nova's branch on (none when
            # the error is not an HTTP one, or has no JSON body).
            with contextlib.suppress(Exception):
                steps[name]["code"] = response.json()["errors"][0].get("code")
            return None

    rp, other = ids["rp"], ids["other"]
    step(
        "create_resource_provider", lambda: placement.create_resource_provider(name="sdk-rp", id=rp)
    )
    step("create_other", lambda: placement.create_resource_provider(name="sdk-other", id=other))
    step("get_resource_provider", lambda: placement.get_resource_provider(rp))
    step("find_resource_provider", lambda: placement.find_resource_provider("sdk-rp"))
    step(
        "update_resource_provider",
        lambda: placement.update_resource_provider(other, name="sdk-other-2"),
    )
    step("resource_providers", lambda: placement.resource_providers(name="sdk-other-2"))
    step("create_resource_class", lambda: placement.create_resource_class(name="CUSTOM_SDK"))
    step("get_resource_class", lambda: placement.get_resource_class("CUSTOM_SDK"))
    step("resource_classes", lambda: placement.resource_classes())
    # From 1.7 a PUT creates the class if missing and reads no body (the SDK sends {}).
    step("update_resource_class", lambda: placement.update_resource_class("CUSTOM_SDK_PUT"))
    step("get_put_class", lambda: placement.get_resource_class("CUSTOM_SDK_PUT"))
    step(
        "create_resource_provider_inventory",
        lambda: placement.create_resource_provider_inventory(
            rp, "VCPU", total=8, allocation_ratio=2.0
        ),
    )
    step(
        "create_inventory_custom",
        lambda: placement.create_resource_provider_inventory(rp, "CUSTOM_SDK", total=3),
    )
    step("resource_provider_inventories", lambda: placement.resource_provider_inventories(rp))
    other_generation = placement.get_resource_provider(other).generation
    step(
        "set_resource_provider_inventories",
        lambda: placement.set_resource_provider_inventories(
            other,
            {"VCPU": {"total": 4}, "MEMORY_MB": {"total": 4096, "reserved": 512}},
            resource_provider_generation=other_generation,
        ),
    )
    step(
        "set_inventories_stale_generation",
        lambda: placement.set_resource_provider_inventories(
            other, {"VCPU": {"total": 2}}, resource_provider_generation=other_generation
        ),
    )
    step("other_inventories", lambda: placement.resource_provider_inventories(other))
    inventory = step(
        "get_resource_provider_inventory",
        lambda: placement.get_resource_provider_inventory("VCPU", rp),
    )
    step(
        "update_resource_provider_inventory",
        lambda: placement.update_resource_provider_inventory(
            inventory,
            rp,
            resource_provider_generation=inventory.resource_provider_generation,
            total=10,  # the whole record: Placement's PUT wants total, the SDK sends changes
            reserved=1,
        ),
    )
    step("create_trait", lambda: placement.create_trait("CUSTOM_SDK_TRAIT"))
    step("get_trait", lambda: placement.get_trait("CUSTOM_SDK_TRAIT"))
    step("traits", lambda: placement.traits(name="startswith:CUSTOM_SDK"))
    generation = placement.get_resource_provider(rp).generation
    step(
        "set_resource_provider_trait",
        lambda: placement.set_resource_provider_trait(
            ResourceProviderTrait(
                resource_provider_id=rp,
                traits=["CUSTOM_SDK_TRAIT", "HW_CPU_X86_AVX2"],
                resource_provider_generation=generation,
            )
        ),
    )
    step("get_resource_provider_trait", lambda: placement.get_resource_provider_trait(rp))
    # With the provider (and so its generation), as 1.19 wants; a bare id sends null.
    provider = placement.get_resource_provider(rp)
    step(
        "set_resource_provider_aggregates",
        lambda: placement.set_resource_provider_aggregates(provider, ids["agg"]),
    )
    step("get_resource_provider_aggregates", lambda: placement.get_resource_provider_aggregates(rp))
    step(
        "fetch_resource_provider_aggregates",
        lambda: placement.fetch_resource_provider_aggregates(rp),
    )
    step("providers_member_of", lambda: placement.resource_providers(member_of=f"in:{ids['agg']}"))
    step("providers_with_room", lambda: placement.resource_providers(resources="VCPU:9"))
    step("providers_required", lambda: placement.resource_providers(required="!CUSTOM_SDK_TRAIT"))
    step("traits_associated", lambda: placement.traits(associated=True))
    step(
        "candidates_member_of_limit",
        lambda: placement.allocation_candidates(
            resources="VCPU:1", member_of=f"in:{ids['agg']}", limit=1
        ),
    )
    step(
        "candidates_unknown_trait",
        lambda: placement.allocation_candidates(resources="VCPU:1", required="CUSTOM_NOT_A_TRAIT"),
    )
    step(
        "allocation_candidates",
        lambda: placement.allocation_candidates(resources="VCPU:2", required="CUSTOM_SDK_TRAIT"),
    )
    step(
        "create_allocations",
        lambda: placement.create_allocations(
            {
                ids["consumer"]: {
                    "allocations": {rp: {"resources": {"VCPU": 2, "CUSTOM_SDK": 1}}},
                    "project_id": ids["project"],
                    "user_id": ids["user"],
                    "consumer_generation": None,
                    "consumer_type": "INSTANCE",
                }
            }
        ),
    )
    step("get_allocation", lambda: placement.get_allocation(ids["consumer"]))
    step("resource_provider_allocations", lambda: placement.resource_provider_allocations(rp))
    step("fetch_resource_provider_usages", lambda: placement.fetch_resource_provider_usages(rp))
    step("usages", lambda: placement.usages(ids["project"]))
    step("usages_of_user", lambda: placement.usages(ids["project"], user_id=ids["user"]))
    step(
        "delete_inventory_in_use",
        lambda: placement.delete_resource_provider_inventory("VCPU", rp),
    )
    step("delete_provider_in_use", lambda: placement.delete_resource_provider(rp))
    held = placement.get_allocation(ids["consumer"])
    # PUT /allocations/{c} replaces the whole record: the SDK sends only what changed, so
    # the owner and generation go along, as Placement needs.
    step(
        "update_allocation",
        lambda: placement.update_allocation(
            ids["consumer"],
            allocations={
                rp: {"resources": {"VCPU": 1}},
                other: {"resources": {"MEMORY_MB": 1024}},
            },
            project_id=held.project_id,
            user_id=held.user_id,
            consumer_generation=held.consumer_generation,
            consumer_type="MIGRATION",
        ),
    )
    step("get_updated_allocation", lambda: placement.get_allocation(ids["consumer"]))
    step("delete_allocation", lambda: placement.delete_allocation(ids["consumer"]))
    step("delete_resource_provider_trait", lambda: placement.delete_resource_provider_trait(rp))
    step("delete_trait", lambda: placement.delete_trait("CUSTOM_SDK_TRAIT"))
    step(
        "delete_inventory_custom",
        lambda: placement.delete_resource_provider_inventory("CUSTOM_SDK", rp),
    )
    step("delete_resource_class", lambda: placement.delete_resource_class("CUSTOM_SDK"))
    step(
        "delete_resource_provider_inventories",
        lambda: placement.delete_resource_provider_inventories(rp),
    )
    step(
        "delete_other_inventories",
        lambda: placement.delete_resource_provider_inventories(other),
    )
    step("delete_resource_provider", lambda: placement.delete_resource_provider(other))
    step("get_deleted", lambda: placement.get_resource_provider(other))
    step("find_deleted", lambda: placement.find_resource_provider("sdk-other-2"))
    step(
        "delete_missing_ignored",
        lambda: placement.delete_resource_provider(other, ignore_missing=True),
    )
    step(
        "delete_missing_trait",
        lambda: placement.delete_trait("CUSTOM_SDK_TRAIT", ignore_missing=False),
    )
    return steps


if __name__ == "__main__":
    given = json.load(sys.stdin)
    answer = run_osc(given) if sys.argv[1] == "osc" else run_sdk(given)
    sys.stdout.write(json.dumps(answer, default=str))
