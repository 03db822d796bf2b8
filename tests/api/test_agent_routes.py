"""Host agents over HTTP: tokens bound to their host, registration, the long-polled work
list, reports by sequence, launch failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from api_helpers import ok, run_server, table_rows

import loadmaster
from loadmaster.api import AuthConfig, create_app
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.service import Loadmaster

ADMIN, AGENT0, AGENT1 = "adm-0c1f", "agt-h0-77aa", "agt-h1-88bb"
NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[Loadmaster, dict[str, httpx.Client]]]:
    lm = loadmaster.open(db_url)
    auth = AuthConfig({ADMIN: "admin", AGENT0: "agent:h0", AGENT1: "agent:h1"})
    server, thread, url = run_server(create_app(lm, auth))
    clients = {
        name: httpx.Client(
            base_url=url, headers={**CLIENT_HEADERS, "Authorization": f"Bearer {token}"}, timeout=30
        )
        for name, token in (("admin", ADMIN), ("h0", AGENT0), ("h1", AGENT1))
    }
    try:
        for host in ("h0", "h1"):
            body = {"hypervisor_uri": f"test:///{host}", "inventories": NODE}
            ok(clients[host].put(f"/hosts/{host}/agent", json=body))
        body = {"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 2048}}
        ok(clients["admin"].post("/flavors", json=body), 201)
        yield lm, clients
    finally:
        for client in clients.values():
            client.close()
        server.should_exit = True
        thread.join(timeout=10)
        lm.close()


def _vm_on(admin: httpx.Client, host: str, name: str) -> str:
    uuid = str(ok(admin.post("/vms", json={"name": name, "flavor": "small"}), 201)["uuid"])
    ok(admin.put(f"/vms/{uuid}/allocations", json={"host": host}))
    return uuid


def test_agent_token_acts_only_for_its_host(
    served: tuple[Loadmaster, dict[str, httpx.Client]],
) -> None:
    lm, c = served
    mine, theirs = _vm_on(c["admin"], "h0", "mine"), _vm_on(c["admin"], "h1", "theirs")
    before = table_rows(lm)
    refused = [
        c["h0"].post("/hosts/h1/report", json={"running_vms": []}),
        c["h0"].put("/hosts/h1/agent", json={"hypervisor_uri": "x", "inventories": NODE}),
        c["h0"].post(f"/vms/{theirs}/up"),
        c["h0"].post(f"/vms/{theirs}/launch-failed", json={"host": "h1", "reason": "x"}),
        c["h0"].post(f"/vms/{mine}/launch-failed", json={"host": "h1", "reason": "x"}),
        c["h0"].post("/flavors", json={"name": "evil", "resources": {"VCPU": 1}}),
        c["h0"].delete(f"/vms/{mine}"),
        c["h0"].put("/resource_providers/h0/inventories", json={}),
    ]
    assert [r.status_code for r in refused] == [403] * len(refused)
    assert table_rows(lm) == before
    assert ok(c["h0"].post(f"/vms/{mine}/up"))["state"] == "running"
    assert ok(c["h0"].get(f"/vms/{theirs}"))["state"] == "pending"  # reading is allowed


def test_work_list_long_poll_wakes_on_a_claim(
    served: tuple[Loadmaster, dict[str, httpx.Client]],
) -> None:
    _lm, c = served
    first = ok(c["h0"].get("/hosts/h0/work"))
    assert first["items"] == []
    answer: dict[str, object] = {}

    def poll() -> None:
        started = time.monotonic()
        answer["body"] = ok(
            c["h0"].get("/hosts/h0/work", params={"after": first["generation"], "wait": 20})
        )
        answer["took"] = time.monotonic() - started

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive(), "the long-poll returned before anything changed"
    vm = _vm_on(c["admin"], "h0", "late")
    waiter.join(timeout=10)
    body = answer["body"]
    assert isinstance(body, dict)
    assert [(i["vm"], i["action"]) for i in body["items"]] == [(vm, "launch")]
    took = answer["took"]
    assert isinstance(took, float) and took < 5


def test_report_by_sequence_and_launch_failure_over_http(
    served: tuple[Loadmaster, dict[str, httpx.Client]],
) -> None:
    lm, c = served
    vm = _vm_on(c["admin"], "h0", "slow")
    seen = ok(c["h0"].get("/hosts/h0/work"))["generation"]
    body = {"running_vms": [], "launching": [vm.upper()], "seen_generation": seen}
    assert ok(c["h0"].post("/hosts/h0/report", json=body))["released"] == []
    failed = ok(
        c["h0"].post(f"/vms/{vm}/launch-failed", json={"host": "h0", "reason": "no hugepages"})
    )
    assert failed["ended"] == "launch"
    assert failed["placement"]["host"] == "h1"
    assert "no hugepages" in failed["vm"]["fault"]
    assert lm.vms.get(vm).host == "h1"
    # The refusing agent may no longer act on the VM; the new host's agent may.
    assert c["h0"].post(f"/vms/{vm}/up").status_code == 403
    up = ok(c["h1"].post(f"/vms/{vm}/up"))
    assert up["state"] == "running" and "no hugepages" in up["fault"]
    status = ok(c["admin"].get("/hosts/h0/agent"))
    assert status["status"] == "ok" and status["hypervisor_uri"] == "test:///h0"


def test_agents_register_their_shared_pool_over_http(
    served: tuple[Loadmaster, dict[str, httpx.Client]],
) -> None:
    lm, clients = served
    pool = {"name": "nfs-a", "inventories": {"DISK_GB": {"total": 100}}}
    for host in ("h0", "h1"):
        body = {"hypervisor_uri": f"test:///{host}", "inventories": NODE, "shared_pool": pool}
        ok(clients[host].put(f"/hosts/{host}/agent", json=body))
    shared = lm.hosts.get("nfs-a")
    assert shared.inventories["DISK_GB"].total == 100
    assert set(shared.aggregates) == set(lm.hosts.get("h0").aggregates)
    assert set(shared.aggregates) == set(lm.hosts.get("h1").aggregates)
    taken = {"name": "h1", "inventories": {"DISK_GB": {"total": 100}}}
    body = {"hypervisor_uri": "test:///h0", "inventories": NODE, "shared_pool": taken}
    refused = clients["h0"].put("/hosts/h0/agent", json=body)
    assert refused.status_code == 409 and "shared_pool.name" in refused.text
