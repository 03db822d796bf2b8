"""What the agent's log tells an operator: one line for each thing the host's manager did
(launch, refusal, migration out and in, removal), naming the VM as the operator named it;
one line for an SLA cycle that acted or failed and none for a quiet one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from manager_helpers import cloud

from loadmaster.agent.hypervisor.base import GuestSpec
from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.manager.host_manager import HostManager, ManagerConfig
from loadmaster.agent.sla.controllers import Action, Failure
from loadmaster.agent.sla.loop import CycleReport
from loadmaster.agent.sla.narration import CycleNarrator


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def having(self, *words: str) -> list[str]:
        return [line for line in self.lines if all(w in line for w in words)]


@pytest.fixture
def manager_log() -> Iterator[Lines]:
    # Straight on the manager's logger: an in-process server stops propagation above it.
    logger = logging.getLogger("loadmaster.agent.manager.host_manager")
    lines, level = Lines(), logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)


def test_each_launch_refusal_migration_and_removal_is_one_line_naming_the_vm(
    db_url: str, manager_log: Lines
) -> None:
    with cloud(db_url, ["src", "dst", "tight"]) as c:
        c.add("src")
        c.add("dst")
        # The ledger sees 64 GiB on "tight", its agent keeps all but 0.5 GiB for the host.
        c.add("tight", config=ManagerConfig(memory_headroom_mb=64 * 1024 - 512))
        [vm, refused] = c.create_vms(2)
        name, refused_name = c.lm.vms.get(vm).name, c.lm.vms.get(refused).name
        assert c.admin.put(f"/vms/{vm}/allocations", json={"host": "src"}).status_code == 200
        c.wait_for(lambda: c.lm.vms.get(vm).state == "running", 30, "the VM running")
        assert c.admin.put(f"/vms/{refused}/allocations", json={"host": "tight"}).status_code == 200
        c.wait_for(lambda: c.lm.vms.get(refused).state == "running", 30, "it running elsewhere")

        moved = c.admin.post(f"/vms/{vm}/migrate", json={"host": "dst"})
        assert moved.status_code == 200, moved.text
        c.wait_for(lambda: c.lm.vms.get(vm).host == "dst", 30, "the migration")
        c.wait_for(lambda: manager_log.having("migrated in"), 30, "the arrival logged")
        assert c.admin.post(f"/vms/{vm}/stop").status_code == 200
        c.wait_for(lambda: vm not in c.where_running(), 30, "the guest stopped")
        c.wait_for(lambda: manager_log.having("removed"), 30, "the removal logged")

    who = f"VM {name} ({vm})"
    assert len(manager_log.having("launched", who, "vCPUs", "MiB")) == 1, manager_log.lines
    [refusal] = manager_log.having("refused to launch", f"VM {refused_name} ({refused})")
    assert "places it elsewhere" in refusal and "real memory free" in refusal
    assert len(manager_log.having("migrating", who, "to host dst")) == 1, manager_log.lines
    assert len(manager_log.having("migrated", who, "to host dst in")) == 1, manager_log.lines
    assert manager_log.having(who, "is migrating here"), manager_log.lines
    assert manager_log.having(who, "migrated in: it runs here"), manager_log.lines
    assert manager_log.having("stopped and removed", who), manager_log.lines
    assert manager_log.having("registered", "host src", "MEMORY_MB=", "VCPU="), manager_log.lines


T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_a_quiet_cycle_writes_nothing_and_one_that_acted_or_failed_a_line() -> None:
    narrator = CycleNarrator()
    assert narrator.lines(CycleReport(cycle=1, guests=4, reported=True), T0) == []
    acted = CycleReport(cycle=2, guests=4, actions=[Action("balloon", "vm-1", "t", 1)])
    [line] = narrator.lines(acted, T0)
    assert line.startswith("cycle 2: 4 guests, 1 actions, 0 failures")
    failed = CycleReport(cycle=3, failures=[Failure("balloon", "vm-1", "gone")])
    assert narrator.lines(failed, T0)[1:] == ["failed: balloon on vm-1: gone"]


def test_a_guest_left_out_again_is_not_news() -> None:
    narrator = CycleNarrator()
    left_out = {"vm-9": "no balloon stats yet"}
    assert narrator.lines(CycleReport(cycle=1, left_out=left_out), T0) != []
    assert narrator.lines(CycleReport(cycle=2, left_out=left_out), T0) == []
    more = {**left_out, "vm-8": "no balloon stats yet"}
    assert narrator.lines(CycleReport(cycle=3, left_out=more), T0) != []


def test_a_move_quicker_than_the_destinations_look_at_its_list_is_logged_as_arrived(
    manager_log: Lines,
) -> None:
    """The destination never saw the ``migrate_in`` item (the move ended before it read
    its list again): the VM running here, new on its list, is still said to have arrived."""
    arrived, other = "6f1c2e1a-0000-4000-8000-000000000001", "6f1c2e1a-0000-4000-8000-000000000002"

    def item(vm: str, name: str) -> dict[str, object]:
        return {"vm": vm, "name": name, "action": "run", "memory_mb": 256, "vcpus": 1}

    class Api:
        lists = [
            {"generation": 1, "items": [item(other, "db-1")]},
            {"generation": 2, "items": [item(other, "db-1"), item(arrived, "app-1")]},
        ]

        def work(self, host: str, after: int, wait: float) -> dict[str, object]:
            return self.lists.pop(0)

    hv = SimulatedHypervisor([], host_memory_kib=4 * GIB)
    manager = HostManager(hv, Api(), ManagerConfig(), host_name="dst", hypervisor_uri="x")  # type: ignore[arg-type]
    try:
        hv.launch_guest(GuestSpec(uuid=other, name="db-1", memory_kib=262144, vcpus=1))
        manager.step()
        hv.launch_guest(GuestSpec(uuid=arrived, name="app-1", memory_kib=262144, vcpus=1))
        manager.step()
    finally:
        manager.close()
    assert manager_log.having(f"VM app-1 ({arrived}) migrated in"), manager_log.lines
    assert not manager_log.having("db-1", "migrated in"), manager_log.lines
