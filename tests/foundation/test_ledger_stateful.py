"""Random sequences of claim / activate / release (twice) / reconcile / inventory change.

After every step, on SQLite and PostgreSQL alike: usage equals the sum of the records,
capacity is never exceeded, each VM's state matches its records, a claim lands exactly
when the free capacity said it would, and a second release changes nothing.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import delete
from tests.foundation.dbstate import dump

from loadmaster.errors import (
    ConcurrentUpdate,
    Conflict,
    InsufficientCapacity,
    InvalidTransition,
    ValidationError,
)
from loadmaster.pending import audit
from loadmaster.service import Loadmaster
from loadmaster.store.schema import (
    AllocationRow,
    FlavorRow,
    HostAggregateRow,
    HostReportRow,
    HostRow,
    HostTraitRow,
    InventoryRow,
    VmRow,
)

HOSTS = ("h0", "h1", "h2")
FLAVORS = {
    "tiny": {"VCPU": 1, "MEMORY_MB": 512},
    "mid": {"VCPU": 2, "MEMORY_MB": 2048},
    "fat": {"VCPU": 4, "MEMORY_MB": 3072},
}


def _wipe(lm: Loadmaster) -> None:
    with lm.store.write() as session:
        for table in (
            AllocationRow,
            VmRow,
            FlavorRow,
            HostReportRow,
            HostAggregateRow,
            HostTraitRow,
            InventoryRow,
        ):
            session.execute(delete(table))
        session.execute(delete(HostRow).where(HostRow.parent_id.is_not(None)))
        session.execute(delete(HostRow))


def make_machine(lm: Loadmaster) -> type[RuleBasedStateMachine]:
    class LedgerMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            _wipe(lm)
            for name in HOSTS:
                lm.hosts.create(
                    name,
                    inventories={
                        "VCPU": {"total": 4, "allocation_ratio": 1.5},
                        "MEMORY_MB": {"total": 6144, "reserved": 1024},
                    },
                )
            for name, resources in FLAVORS.items():
                lm.flavors.create({"name": name, "resources": resources})
            self.vms: list[str] = []

        @initialize(flavors=st.lists(st.sampled_from(sorted(FLAVORS)), min_size=4, max_size=8))
        def create_fleet(self, flavors: list[str]) -> None:
            for flavor in flavors:
                self.create_vm(flavor)

        @rule(flavor=st.sampled_from(sorted(FLAVORS)))
        def create_vm(self, flavor: str) -> None:
            self.vms.append(lm.vms.create(f"vm{len(self.vms)}", flavor).uuid)

        @precondition(lambda self: self.vms)
        @rule(data=st.data(), host=st.sampled_from(HOSTS))
        def claim(self, data: st.DataObject, host: str) -> None:
            vm_uuid = data.draw(st.sampled_from(self.vms))
            vm = lm.vms.get(vm_uuid)
            free = {rc: u.free for rc, u in lm.allocations.usages([host])[host].items()}
            claimable = vm.state in ("requested", "stopped") or (
                vm.state == "running" and vm.host != host
            )
            fits = all(free.get(rc, 0) >= amount for rc, amount in vm.resources.items())
            up = lm.hosts.get(host).state == "up"
            try:
                lm.allocations.claim(vm_uuid, host)
                landed = True
            except (InsufficientCapacity, InvalidTransition, Conflict, ValidationError):
                landed = False
            assert landed == (claimable and fits and up), (vm.state, free, vm.resources, up)

        @precondition(lambda self: self.vms)
        @rule(data=st.data())
        def activate(self, data: st.DataObject) -> None:
            vm_uuid = data.draw(st.sampled_from(self.vms))
            state = lm.vms.get(vm_uuid).state
            try:
                lm.allocations.activate(vm_uuid)
            except InvalidTransition:
                assert state not in ("pending", "migrating", "running")
                return
            assert lm.vms.get(vm_uuid).state == "running"
            assert lm.allocations.allocations(vm=vm_uuid, state="pending") == []

        @precondition(lambda self: self.vms)
        @rule(data=st.data(), on_host=st.one_of(st.none(), st.sampled_from(HOSTS)))
        def release_twice(self, data: st.DataObject, on_host: str | None) -> None:
            vm_uuid = data.draw(st.sampled_from(self.vms))
            try:
                lm.allocations.release(vm_uuid, on_host)
            except InvalidTransition:
                return  # the source of a migration in flight; refused, checked by invariants
            before = dump(lm)
            assert lm.allocations.release(vm_uuid, on_host) == 0
            assert dump(lm) == before

        @rule(host=st.sampled_from(HOSTS), data=st.data())
        def reconcile(self, host: str, data: st.DataObject) -> None:
            present = (
                data.draw(st.lists(st.sampled_from(self.vms), unique=True)) if self.vms else []
            )
            lm.allocations.reconcile(host, present)

        @rule(host=st.sampled_from(HOSTS), total=st.integers(1, 8))
        def change_vcpu_inventory(self, host: str, total: int) -> None:
            used = lm.allocations.usages([host])[host]["VCPU"].used
            try:
                lm.hosts.set_inventory(host, "VCPU", {"total": total, "allocation_ratio": 1.5})
                assert int(total * 1.5) >= used
            except Conflict as exc:
                assert not isinstance(exc, ConcurrentUpdate)
                assert int(total * 1.5) < used

        @rule(host=st.sampled_from(HOSTS), state=st.sampled_from(["up", "maintenance", "up"]))
        def host_state(self, host: str, state: str) -> None:
            lm.hosts.set_state(host, state)

        @precondition(lambda self: self.vms)
        @rule(data=st.data())
        def stop_or_delete(self, data: st.DataObject) -> None:
            vm_uuid = data.draw(st.sampled_from(self.vms))
            action = data.draw(st.sampled_from([lm.allocations.stop, lm.allocations.delete]))
            try:
                action(vm_uuid)
            except InvalidTransition:
                return
            assert lm.allocations.allocations(vm=vm_uuid) == []

        @invariant()
        def usage_is_the_sum_of_records(self) -> None:
            records = lm.allocations.allocations()
            sums: dict[tuple[str, str, str], int] = defaultdict(int)
            for r in records:
                sums[(r.host, r.resource_class, r.state)] += r.amount
            for host, classes in lm.allocations.usages().items():
                for rc, usage in classes.items():
                    assert usage.active == sums[(host, rc, "active")]
                    assert usage.pending == sums[(host, rc, "pending")]
                    assert usage.used <= usage.capacity, (host, rc, usage)

        @invariant()
        def audit_finds_nothing(self) -> None:
            assert audit(lm.store) == []

        @invariant()
        def vm_state_matches_records(self) -> None:
            by_vm = defaultdict(list)
            for r in lm.allocations.allocations():
                by_vm[r.vm].append(r)
            for vm in lm.vms.list(include_deleted=True):
                records = by_vm.get(vm.uuid, [])
                states = {(r.host, r.state) for r in records}
                if vm.state in ("requested", "stopped", "deleted"):
                    assert not records, (vm.state, records)
                elif vm.state == "pending":
                    assert states == {(vm.host, "pending")}
                elif vm.state == "running":
                    assert states == {(vm.host, "active")}
                else:
                    assert states == {(vm.host, "active"), (vm.target_host, "pending")}

    return LedgerMachine


def test_ledger_invariants(lm: Loadmaster) -> None:
    run_state_machine_as_test(
        make_machine(lm),
        settings=settings(
            max_examples=25,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
