"""The audit finds each kind of damage it claims to find."""

from __future__ import annotations

from sqlalchemy import select, update

from loadmaster.pending import audit
from loadmaster.service import Loadmaster
from loadmaster.store.locking import now
from loadmaster.store.schema import AllocationRow, InventoryRow, VmRow


def _setup(lm: Loadmaster) -> list[str]:
    lm.hosts.create("h", inventories={"VCPU": {"total": 4}, "MEMORY_MB": {"total": 4096}})
    lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    uuids = [lm.vms.create(f"v{i}", "f").uuid for i in range(3)]
    lm.allocations.claim(uuids[0], "h")
    lm.allocations.claim(uuids[1], "h")
    lm.allocations.activate(uuids[1])
    return uuids


def test_clean_database_has_no_problems(lm: Loadmaster) -> None:
    _setup(lm)
    assert audit(lm.store) == []


def test_each_kind_of_damage_is_found(lm: Loadmaster) -> None:
    uuids = _setup(lm)
    with lm.store.write() as session:
        vm_ids = {
            u: session.scalar(select(VmRow.consumer_id).where(VmRow.uuid == u)) for u in uuids
        }
        # a claim that lost one of its classes
        session.execute(
            AllocationRow.__table__.delete().where(
                AllocationRow.consumer_id == vm_ids[uuids[0]], AllocationRow.amount == 1024
            )
        )
        # records for a VM that was never placed
        host_id = session.scalar(select(AllocationRow.host_id).limit(1))
        class_id = session.scalar(select(AllocationRow.resource_class_id).limit(1))
        session.add(
            AllocationRow(
                consumer_id=vm_ids[uuids[2]],
                host_id=host_id,
                resource_class_id=class_id,
                amount=1,
                state="pending",
                created_at=now(),
            )
        )
        # an inventory shrunk behind the ledger's back
        session.execute(update(InventoryRow).values(total=1))
    kinds = {(p.kind, p.subject) for p in audit(lm.store)}
    assert ("partial_claim", uuids[0]) in kinds
    assert ("orphaned", uuids[2]) in kinds
    assert ("over_capacity", "h") in kinds
