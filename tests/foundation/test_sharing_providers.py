"""A storage pool several hosts mount, as Placement models it: one sharing provider
(``MISC_SHARES_VIA_AGGREGATE``, DISK_GB) in an aggregate with the hosts, which offer no
DISK_GB of their own. Claims on any of them draw DISK_GB from the pool, which is never
overcommitted, and a migration between two of them moves none of it."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import event
from tests.foundation.test_ledger import running
from tests.foundation.test_ledger_stateful import _wipe

from loadmaster.errors import Conflict, InsufficientCapacity, InvalidTransition, ValidationError
from loadmaster.pending import audit
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster

POOL_AGG = "5e1f1c1e-0000-4000-8000-000000000001"
HOSTS = ("h1", "h2")


@pytest.fixture
def pooled(lm: Loadmaster) -> Loadmaster:
    return pooled_setup(lm)


def pooled_setup(lm: Loadmaster) -> Loadmaster:
    lm.hosts.create("pool", inventories={"DISK_GB": {"total": 100}})
    lm.hosts.set_traits("pool", ["MISC_SHARES_VIA_AGGREGATE"])
    lm.hosts.set_aggregates("pool", [POOL_AGG])
    for name in HOSTS:
        lm.hosts.create(name, inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}})
        lm.hosts.set_aggregates(name, [POOL_AGG])
    lm.flavors.create(
        {"name": "disk40", "resources": {"VCPU": 1, "MEMORY_MB": 1024, "DISK_GB": 40}}
    )
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    return lm


def test_vms_on_two_hosts_draw_disk_from_the_one_pool(pooled: Loadmaster) -> None:
    lm = pooled
    a, b, c = (lm.vms.create(n, "disk40") for n in "abc")
    lm.allocations.claim(a.uuid, "h1")
    lm.allocations.claim(b.uuid, "h2")
    assert lm.allocations.pending_for_vm(a.uuid) == {
        "h1": {"VCPU": 1, "MEMORY_MB": 1024},
        "pool": {"DISK_GB": 40},
    }
    assert lm.allocations.usages(["pool"])["pool"]["DISK_GB"].pending == 80
    # 20 GB left of the pool: the third fits on neither host.
    for host in ("h1", "h2"):
        with pytest.raises(InsufficientCapacity, match="DISK_GB on pool"):
            lm.allocations.claim(c.uuid, host)
    assert lm.vms.get(c.uuid).state == "requested"
    # A launch that fails gives the pool's share back with the host's.
    lm.allocations.fail(a.uuid, "h1", "no room for the guest")
    assert lm.allocations.usages(["pool"])["pool"]["DISK_GB"].used == 40
    lm.allocations.claim(c.uuid, "h1")


@pytest.mark.parametrize("on_the_pool", [True, False])
def test_a_claim_reads_the_sharing_providers_with_its_trees(
    pooled: Loadmaster, on_the_pool: bool
) -> None:
    """One statement reads a claim's trees and the sharing providers they reach: a query
    of its own was a round trip more for every placement, mostly finding none."""
    lm = pooled
    if not on_the_pool:
        lm.hosts.set_aggregates("h1", [])
    vm = lm.vms.create("a", "disk40" if on_the_pool else "small")
    reads: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "host_aggregates" in statement:
            reads.append(statement)

    event.listen(lm.store.engine, "before_cursor_execute", note)
    try:
        lm.allocations.claim(vm.uuid, "h1")
    finally:
        event.remove(lm.store.engine, "before_cursor_execute", note)
    assert len(reads) == 1 and "FROM inventories" in reads[0], reads
    expected = {"h1": {"VCPU": 1, "MEMORY_MB": 1024}}
    if on_the_pool:
        expected["pool"] = {"DISK_GB": 40}
    assert lm.allocations.pending_for_vm(vm.uuid) == expected


def test_a_migration_between_hosts_of_the_pool_moves_no_disk(pooled: Loadmaster) -> None:
    lm = pooled
    vm = running(lm, "m", "disk40", "h1")
    lm.allocations.claim(vm, "h2")
    assert lm.allocations.pending_for_vm(vm) == {"h2": {"VCPU": 1, "MEMORY_MB": 1024}}
    assert lm.allocations.usages(["pool"])["pool"]["DISK_GB"].used == 40  # held once
    lm.allocations.activate(vm)
    assert lm.allocations.usages(["pool"])["pool"]["DISK_GB"].active == 40
    assert lm.allocations.usages(["h1"])["h1"]["VCPU"].used == 0
    # Back again, aborted: the disk stays held by the VM, running where it was.
    lm.allocations.claim(vm, "h1")
    lm.allocations.fail(vm, "h1", "cannot receive")
    record = lm.vms.get(vm)
    assert (record.state, record.host) == ("running", "h2")
    assert lm.allocations.usages(["pool"])["pool"]["DISK_GB"].active == 40
    lm.allocations.release(vm)
    assert lm.allocations.usages(["pool"])["pool"]["DISK_GB"].used == 0


def test_the_source_of_a_migration_within_the_pool_is_not_released_before_its_end(
    pooled: Loadmaster,
) -> None:
    """Found by ``test_pool_invariants``: releasing the source of a migration whose
    destination was still pending left the VM running on the source with only its disk
    (the pool's record, active, hid that every other record left was pending)."""
    lm = pooled
    vm = lm.vms.create("a", "disk40").uuid
    lm.allocations.claim(vm, "h2")
    lm.allocations.activate(vm)
    lm.allocations.claim(vm, "h1")
    with pytest.raises(InvalidTransition, match=r"finish \(activate\) or abort"):
        lm.allocations.release(vm, "h2")
    record = lm.vms.get(vm)
    assert (record.state, record.host, record.target_host) == ("migrating", "h2", "h1")
    assert audit(lm.store) == []
    # Aborting is releasing the destination: the VM runs on its source with all it had.
    lm.allocations.release(vm, "h1")
    assert lm.allocations.pending_for_vm(vm) == {}
    assert {(a.host, a.resource_class) for a in lm.allocations.allocations(vm=vm)} == {
        ("h2", "VCPU"),
        ("h2", "MEMORY_MB"),
        ("pool", "DISK_GB"),
    }
    assert lm.vms.get(vm).state == "running"
    assert audit(lm.store) == []


def test_the_scheduler_places_on_hosts_of_the_pool_within_its_capacity(
    pooled: Loadmaster,
) -> None:
    lm = pooled
    vms = [lm.vms.create(f"v{i}", "disk40") for i in range(4)]
    result = lm.scheduler.schedule([RequestSpec(vms=[v.uuid for v in vms])])
    placed = [p for p in result.placements if p.ok]
    # The pool holds two of 40 GB; the hosts' CPUs and memory would hold all four.
    assert len(placed) == 2
    assert {p.host for p in placed} <= {"h1", "h2"}
    assert all("DISK_GB" in str(p.error) for p in result.placements if not p.ok)
    assert lm.allocations.usages(["pool"])["pool"]["DISK_GB"].pending == 80
    # A batch of one per call sees the pool as the claims left it.
    for v in vms:
        if lm.vms.get(v.uuid).state == "requested":
            assert not lm.scheduler.schedule([RequestSpec(vms=[v.uuid])]).ok


def test_the_scheduler_migrates_within_the_pool_without_disk_room(pooled: Loadmaster) -> None:
    lm = pooled
    vms = [lm.vms.create(n, "disk40") for n in ("x", "y")]
    for v in vms:
        lm.allocations.claim(v.uuid, "h1")
        lm.allocations.activate(v.uuid)
    # 20 GB free in the pool: the move needs none of it, and takes none.
    result = lm.scheduler.migrate(vms[0].uuid)
    assert result.ok, result.placements[0].error
    assert result.placements[0].host == "h2"
    assert lm.allocations.pending_for_vm(vms[0].uuid) == {"h2": {"VCPU": 1, "MEMORY_MB": 1024}}
    lm.allocations.activate(vms[0].uuid)
    assert lm.allocations.usages(["pool"])["pool"]["DISK_GB"].active == 80
    # A new VM still finds no room: the scheduler's view kept the pool as it was.
    z = lm.vms.create("z", "disk40")
    assert not lm.scheduler.schedule([RequestSpec(vms=[z.uuid])]).ok


def make_machine(lm: Loadmaster) -> type[RuleBasedStateMachine]:
    class PoolMachine(RuleBasedStateMachine):
        """Random launches, migrations, failures, releases and deletes on two hosts of
        one pool: the pool holds each placed VM's disk exactly once and is never
        overcommitted."""

        def __init__(self) -> None:
            super().__init__()
            _wipe(lm)
            pooled_setup(lm)
            lm.flavors.create(
                {"name": "disk10", "resources": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 10}}
            )
            self.vms: list[str] = []

        @rule(flavor=st.sampled_from(["disk10", "disk40"]))
        def create_vm(self, flavor: str) -> None:
            self.vms.append(lm.vms.create(f"vm{len(self.vms)}", flavor).uuid)

        @precondition(lambda self: self.vms)
        @rule(data=st.data(), host=st.sampled_from(HOSTS))
        def claim(self, data: st.DataObject, host: str) -> None:
            vm = data.draw(st.sampled_from(self.vms))
            record = lm.vms.get(vm)
            free = {
                **{rc: u.free for rc, u in lm.allocations.usages([host])[host].items()},
                "DISK_GB": lm.allocations.usages(["pool"])["pool"]["DISK_GB"].free,
            }
            fits = lm.hosts.get(host).state == "up" and all(
                free[rc] >= amount for rc, amount in record.resources.items()
            )
            landed = False
            with contextlib.suppress(
                InsufficientCapacity, InvalidTransition, ValidationError, Conflict
            ):
                lm.allocations.claim(vm, host)
                landed = True
            if record.state in ("requested", "stopped"):
                assert landed == fits, (free, record.resources)

        @precondition(lambda self: self.vms)
        @rule(data=st.data())
        def activate(self, data: st.DataObject) -> None:
            with contextlib.suppress(InvalidTransition):
                lm.allocations.activate(data.draw(st.sampled_from(self.vms)))

        @precondition(lambda self: self.vms)
        @rule(data=st.data(), host=st.sampled_from(HOSTS))
        def fail(self, data: st.DataObject, host: str) -> None:
            lm.allocations.fail(data.draw(st.sampled_from(self.vms)), host, "refused")

        @precondition(lambda self: self.vms)
        @rule(data=st.data(), on_host=st.one_of(st.none(), st.sampled_from(HOSTS)))
        def release(self, data: st.DataObject, on_host: str | None) -> None:
            with contextlib.suppress(InvalidTransition):
                lm.allocations.release(data.draw(st.sampled_from(self.vms)), on_host)

        @rule(host=st.sampled_from(HOSTS), state=st.sampled_from(["down", "up", "up"]))
        def host_state(self, host: str, state: str) -> None:
            lm.hosts.set_state(host, state)

        @precondition(lambda self: self.vms)
        @rule(data=st.data(), host=st.sampled_from(HOSTS))
        def evacuate(self, data: st.DataObject, host: str) -> None:
            vm = data.draw(st.sampled_from(self.vms))
            with contextlib.suppress(InsufficientCapacity, InvalidTransition, Conflict):
                lm.allocations.claim(vm, host, intent="evacuate")

        @precondition(lambda self: self.vms)
        @rule(data=st.data())
        def delete(self, data: st.DataObject) -> None:
            lm.allocations.delete(data.draw(st.sampled_from(self.vms)))

        @invariant()
        def the_pool_holds_each_placed_disk_once(self) -> None:
            usage = lm.allocations.usages(["pool"])["pool"]["DISK_GB"]
            assert usage.used <= usage.capacity
            placed = [vm for vm in lm.vms.list() if vm.state in ("pending", "running", "migrating")]
            assert usage.used == sum(vm.resources["DISK_GB"] for vm in placed)
            for vm in placed:
                on_pool = lm.allocations.allocations(vm=vm.uuid, host="pool")
                assert sum(r.amount for r in on_pool) == vm.resources["DISK_GB"]

        @invariant()
        def audit_finds_nothing(self) -> None:
            # (A VM on a host set down waits there for its evacuation: not a fault here.)
            assert [p for p in audit(lm.store) if p.kind != "on_down_host"] == []

    return PoolMachine


def test_pool_invariants(lm: Loadmaster) -> None:
    run_state_machine_as_test(
        make_machine(lm),
        settings=settings(
            max_examples=15,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_an_evacuation_within_the_pool_needs_no_second_room_for_the_disk(
    pooled: Loadmaster,
) -> None:
    lm = pooled
    lm.hosts.set_inventory("pool", "DISK_GB", {"total": 80})
    vms = [lm.vms.create(n, "disk40") for n in ("x", "y")]
    for v in vms:
        lm.allocations.claim(v.uuid, "h1")
        lm.allocations.activate(v.uuid)
    lm.hosts.set_state("h1", "down")
    # The pool is full, but the disk is the VM's already: it moves with it.
    lm.allocations.claim(vms[0].uuid, "h2", intent="evacuate")
    assert lm.allocations.pending_for_vm(vms[0].uuid) == {
        "h2": {"VCPU": 1, "MEMORY_MB": 1024},
        "pool": {"DISK_GB": 40},
    }
    assert lm.allocations.usages(["pool"])["pool"]["DISK_GB"].used == 80
    assert [(p.kind, p.subject) for p in audit(lm.store)] == [("on_down_host", vms[1].uuid)]
