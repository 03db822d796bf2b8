"""Host-manager tests run on ``loadmaster.demo.SimulatedCloud``: the API over HTTP and a
real agent per simulated host, each bound to its own token. Here: what tests check."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import loadmaster
from loadmaster.agent.manager.host_manager import ManagerConfig
from loadmaster.cluster import VmSpec
from loadmaster.demo.cloud import HostPlan, SimHost, SimulatedCloud
from loadmaster.pending import audit


class Cloud(SimulatedCloud):
    def add(
        self,
        name: str,
        *,
        memory_gib: int = 64,
        config: ManagerConfig | None = None,
        launch_delay: float = 0.0,
        start: bool = True,
    ) -> SimHost:
        plan = HostPlan(
            name, memory_gib=memory_gib, launch_delay=launch_delay, config=config or ManagerConfig()
        )
        return self.add_host(plan, start=start)

    def create_vms(self, count: int, flavor: str = "small", **fields: Any) -> list[str]:
        """Created in one go in-process: the subject is what agents do with them."""
        first = len(self.lm.vms.list())
        specs = [VmSpec(f"{flavor}-{first + i}", flavor, **fields) for i in range(count)]
        return [vm.uuid for vm in self.lm.vms.create_many(specs)]

    def schedule(self, uuids: list[str]) -> dict[str, Any]:
        response = self.admin.post("/schedule", json={"requests": [{"vms": uuids}]})
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def wait_for(
        self, condition: Callable[[], bool], timeout: float = 60.0, what: str = ""
    ) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for vm in self.lm.vms.list():
            counts[vm.state] = counts.get(vm.state, 0) + 1
        return counts

    def assert_consistent(self) -> None:
        assert audit(self.lm.store) == []
        running = self.where_running()
        assert all(len(hosts) == 1 for hosts in running.values()), running
        for vm in self.lm.vms.list():
            if vm.state == "running":
                assert running.get(vm.uuid) == [vm.host], (vm.uuid, vm.host, running.get(vm.uuid))


@contextmanager
def cloud(db_url: str, host_names: list[str]) -> Iterator[Cloud]:
    lm = loadmaster.open(db_url)
    made = Cloud(lm, sla=False, agent_hosts=host_names)
    body = {"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 1024}}
    try:
        assert made.admin.post("/flavors", json=body).status_code == 201
        yield made
    finally:
        made.close()
        lm.close()
