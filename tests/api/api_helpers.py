"""Helpers for the API tests: a small cluster built over HTTP, and a database dump."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from sqlalchemy import select

from loadmaster.api.server import serve_in_thread
from loadmaster.service import Loadmaster
from loadmaster.store.schema import Base


@dataclass
class Live:
    url: str
    lm: Loadmaster
    admin: httpx.Client
    reader: httpx.Client
    anonymous: httpx.Client
    member: httpx.Client


def run_server(app: object) -> tuple[uvicorn.Server, threading.Thread, str]:
    served = serve_in_thread(app)  # type: ignore[arg-type]
    return served.server, served.thread, served.url


def table_rows(lm: Loadmaster) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table: equal before and after means nothing changed."""
    with lm.store.read() as session:
        return {
            table.name: sorted((tuple(r) for r in session.execute(select(table)).all()), key=repr)
            for table in Base.metadata.sorted_tables
        }


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return None if status == 204 else response.json()


def build_cluster(admin: httpx.Client, hosts: int = 3) -> None:
    """``hosts`` hosts with 8 VCPU and 16 GiB, the first one with 2 CUSTOM_GPU; flavors
    ``small`` (2 VCPU, 4 GiB) and ``gpu`` (1 GPU)."""
    ok(admin.post("/classes", json={"name": "CUSTOM_GPU", "kind": "accelerator"}), 201)
    assert admin.put("/traits/CUSTOM_FAST").status_code == 201  # no body, as Placement
    for i in range(hosts):
        inventories: dict[str, Any] = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 16384}}
        if i == 0:
            inventories["CUSTOM_GPU"] = {"total": 2}
        body = {"name": f"h{i}", "inventories": inventories, "aggregates": ["rack-1"]}
        ok(admin.post("/hosts", json=body), 201)
    ok(
        admin.post("/flavors", json={"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 4096}}),
        201,
    )
    gpu = {"name": "gpu", "resources": {"VCPU": 1, "MEMORY_MB": 1024, "CUSTOM_GPU": 1}}
    ok(admin.post("/flavors", json=gpu), 201)


def new_vm(admin: httpx.Client, name: str, flavor: str = "small", **fields: Any) -> str:
    vm = ok(admin.post("/vms", json={"name": name, "flavor": flavor, **fields}), 201)
    return str(vm["uuid"])
