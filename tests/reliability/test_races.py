"""Identical and conflicting writes from several processes at the same instant, against
``loadmaster serve --workers 4`` on PostgreSQL (issue 13, defects 2 and 3).

Six client processes meet at a barrier before every request, so each race really is six
requests in flight together, spread over four server workers. Expected: idempotent writes
all succeed with the same answer, duplicate creates give one 201 and 409s, delete-versus-use
gives 204/2xx or 409/404 consistently with what the database holds; never a 5xx, and
PostgreSQL's own deadlock counter does not move.
"""

from __future__ import annotations

import multiprocessing as mp
import uuid as uuidlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import text

import loadmaster
from harness import ServedApi
from loadmaster.cluster import VmSpec
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.pending import audit

CLIENTS = 6
ROUNDS = 2

Request = tuple[str, str, dict[str, Any] | None]
Answer = tuple[int, Any]


def _vm_uuid(tag: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"loadmaster-race-{tag}"))


def _scenarios(r: int) -> dict[str, Callable[[int], Request]]:
    """Race name -> what client ``i`` sends in round ``r``."""
    vm_body = {"name": f"retry{r}", "flavor": "f", "uuid": _vm_uuid(f"retry{r}")}
    return {
        "put_trait": lambda i: ("PUT", f"/traits/CUSTOM_T{r}", None),
        "put_class": lambda i: ("PUT", f"/classes/CUSTOM_C{r}", {}),
        "put_placement_class": lambda i: ("PUT", f"/resource_classes/CUSTOM_PC{r}", None),
        "post_provider": lambda i: ("POST", "/resource_providers", {"name": f"rp{r}"}),
        "post_flavor": lambda i: (
            "POST",
            "/flavors",
            {"name": f"fl{r}", "resources": {"VCPU": 1}},
        ),
        "post_group": lambda i: (
            "POST",
            "/server_groups",
            {"name": f"sg{r}", "policy": "anti-affinity"},
        ),
        "vm_retry": lambda i: ("POST", "/vms", vm_body),
        "vm_conflict": lambda i: (
            "POST",
            "/vms",
            {"name": f"n{i}", "flavor": "f", "uuid": _vm_uuid(f"conflict{r}")},
        ),
        "trait_delete_vs_use": lambda i: (
            ("DELETE", f"/traits/CUSTOM_DT{r}", None)
            if i == 0
            else (
                "POST",
                "/hosts",
                {"name": f"dt{r}-{i}", "traits": [f"CUSTOM_DT{r}"]},
            )
        ),
        "flavor_delete_vs_use": lambda i: (
            ("DELETE", f"/flavors/dfl{r}", None)
            if i == 0
            else ("POST", "/vms", {"name": f"df{r}-{i}", "flavor": f"dfl{r}"})
        ),
        "group_delete_vs_use": lambda i: (
            ("DELETE", f"/server_groups/dg{r}", None)
            if i == 0
            else ("POST", "/vms", {"name": f"dg{r}-{i}", "flavor": "f", "group": f"dg{r}"})
        ),
        "class_delete_vs_use": lambda i: (
            ("DELETE", f"/resource_classes/CUSTOM_DC{r}", None)
            if i == 0
            else (
                "POST",
                "/vms",
                {"name": f"dc{r}-{i}", "flavor": "f", "overrides": {f"CUSTOM_DC{r}": 1}},
            )
        ),
        "host_delete_vs_claim": lambda i: (
            ("DELETE", f"/resource_providers/dh{r}", None)
            if i == 0
            else ("PUT", f"/vms/{_vm_uuid(f'dh{r}-{i}')}/allocations", {"host": f"dh{r}"})
        ),
        "member_delete_vs_claim": lambda i: (
            ("DELETE", f"/vms/{_vm_uuid(f'placed{r}-{i}')}", None)
            if i < CLIENTS // 2
            else ("PUT", f"/vms/{_vm_uuid(f'member{r}-{i}')}/allocations", {"host": "gh"})
        ),
    }


def _setup(url: str) -> None:
    with loadmaster.open(url) as lm:
        big = {"VCPU": {"total": 10_000}, "MEMORY_MB": {"total": 10**7}}
        lm.hosts.create("gh", inventories=big)
        lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 64}})
        for r in range(ROUNDS):
            lm.traits.create(f"CUSTOM_DT{r}")
            lm.resource_classes.create(f"CUSTOM_DC{r}")
            lm.flavors.create({"name": f"dfl{r}", "resources": {"VCPU": 1}})
            lm.groups.create(f"dg{r}", "affinity")
            lm.hosts.create(f"dh{r}", inventories=big)
            lm.groups.create(f"aff{r}", "affinity")
            specs = [VmSpec(f"dh{r}-{i}", "f", uuid=_vm_uuid(f"dh{r}-{i}")) for i in range(CLIENTS)]
            specs += [
                VmSpec(f"{kind}{r}-{i}", "f", group=f"aff{r}", uuid=_vm_uuid(f"{kind}{r}-{i}"))
                for kind in ("placed", "member")
                for i in range(CLIENTS)
            ]
            lm.vms.create_many(specs)
            for i in range(CLIENTS):
                lm.allocations.claim(_vm_uuid(f"placed{r}-{i}"), "gh")


def _client(
    index: int, base_url: str, token: str, barrier: Any, answers: Any, plan: list[str]
) -> None:
    with httpx.Client(
        base_url=base_url,
        headers={**CLIENT_HEADERS, "Authorization": f"Bearer {token}"},
        timeout=60,
    ) as http:
        for key in plan:
            r, name = key.split(":", 1)
            method, path, body = _scenarios(int(r))[name](index)
            barrier.wait(timeout=120)
            response = http.request(method, path, json=body)
            try:
                payload: Any = response.json()
            except ValueError:
                payload = response.text
            answers.put((key, index, method, response.status_code, payload))


def _deadlocks(url: str) -> int:
    with loadmaster.open(url, migrate=False) as lm, lm.store.engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(
            conn.execute(
                text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )


@pytest.mark.postgres
def test_simultaneous_identical_and_conflicting_writes(pg_url: str) -> None:
    _setup(pg_url)
    plan = [f"{r}:{name}" for r in range(ROUNDS) for name in _scenarios(r)]
    before = _deadlocks(pg_url)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(CLIENTS)
    answers = ctx.Queue()
    with ServedApi(pg_url, workers=4) as api:
        procs = [
            ctx.Process(target=_client, args=(i, api.url, api.token, barrier, answers, plan))
            for i in range(CLIENTS)
        ]
        for p in procs:
            p.start()
        got: dict[str, list[tuple[int, str, int, Any]]] = defaultdict(list)
        for _ in range(CLIENTS * len(plan)):
            key, index, method, status, payload = answers.get(timeout=120)
            got[key].append((index, method, status, payload))
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
    server_errors = [(k, a) for k, found in got.items() for a in found if a[2] >= 500]
    assert server_errors == []
    # No refusal shows the database's own words (SQL, key values, process ids).
    leaks = [
        (k, a)
        for k, found in got.items()
        for a in found
        if a[2] >= 400 and any(w in str(a[3]) for w in ("INSERT", "UPDATE", "Key (", "psycopg"))
    ]
    assert leaks == []
    for key, found in got.items():
        name = key.split(":", 1)[1]
        statuses = sorted(status for _, _, status, _ in found)
        if name in ("put_trait", "put_placement_class"):
            # As Placement answers: the one that created it 201, the others 204.
            assert statuses == [201] + [204] * (CLIENTS - 1), key
        elif name == "put_class":
            assert statuses == [200] * CLIENTS, key
            assert len({repr(p) for *_, p in found}) == 1, key
        elif name == "post_provider":
            # Placement answers a created provider 200 from microversion 1.20.
            assert statuses == [200] + [409] * (CLIENTS - 1), (key, found)
        elif name in ("post_flavor", "post_group", "vm_conflict"):
            assert statuses == [201] + [409] * (CLIENTS - 1), (key, found)
        elif name == "vm_retry":
            assert statuses == [201] * CLIENTS, (key, found)
            assert len({repr(p) for *_, p in found}) == 1, key
        elif name == "member_delete_vs_claim":
            assert all(s in (200, 204) for s in statuses), (key, found)
        else:  # delete versus use: each side wins or is told why
            for _, method, status, payload in found:
                allowed = (204, 409) if method == "DELETE" else (200, 201, 404, 409)
                assert status in allowed, (key, method, status, payload)
                if status in (404, 409):
                    assert payload["detail"], (key, payload)
    assert _deadlocks(pg_url) - before == 0
    with loadmaster.open(pg_url, migrate=False) as lm:
        assert audit(lm.store) == []
        # Delete versus use left nothing half-done: a thing deleted is used by nothing.
        for r in range(ROUNDS):
            trait_left = f"CUSTOM_DT{r}" in lm.traits.list()
            tagged = [h.name for h in lm.hosts.list() if f"CUSTOM_DT{r}" in h.traits]
            assert trait_left or not tagged
            class_left = f"CUSTOM_DC{r}" in {c.name for c in lm.resource_classes.list()}
            overriding = [v for v in lm.vms.list() if f"CUSTOM_DC{r}" in v.overrides]
            assert class_left or not overriding
            flavor_left = f"dfl{r}" in {f.name for f in lm.flavors.list()}
            assert flavor_left or not [v for v in lm.vms.list() if v.flavor == f"dfl{r}"]
            group_left = f"dg{r}" in {g.name for g in lm.groups.list()}
            assert group_left or not [v for v in lm.vms.list() if v.group == f"dg{r}"]
