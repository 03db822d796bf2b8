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


def test_vms_the_hosts_do_not_run_are_found(lm: Loadmaster) -> None:
    """The ledger against what its hosts said: a VM running on a host whose agent's last
    report lists no such guest though it knew the VM ran there, and VMs on a host that
    is down."""
    node = {"VCPU": {"total": 4}, "MEMORY_MB": {"total": 4096}}
    for host in ("h", "d"):
        lm.host_agents.register(host, hypervisor_uri=f"test+unix:///{host}", inventories=node)
    lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    listed, unlisted, doomed, waiting = (lm.vms.create(n, "f").uuid for n in "abcd")
    lm.allocations.claim(listed, "h")
    seen = lm.host_agents.generation("h")
    # The report starts the VM it lists: the ledger keeps what the agent said.
    assert lm.host_agents.report("h", [listed], seen_generation=seen).activated == (listed,)
    for vm, host in ((unlisted, "h"), (doomed, "d")):
        lm.allocations.claim(vm, host)
        lm.allocations.activate(vm)
    lm.allocations.claim(waiting, "d")
    # Up since that report: newer than what the agent had seen, not judged by it.
    assert audit(lm.store) == []
    # Behind the reports' back (a database restored from a backup, a hand edit), the ledger
    # has the VM running there since before a report that lists no such guest.
    with lm.store.write() as session:
        session.execute(update(VmRow).where(VmRow.uuid == unlisted).values(host_seq=seen))
    found = {(p.kind, p.subject): p.detail for p in audit(lm.store)}
    assert list(found) == [("not_running", unlisted)]
    assert "running on host h in the ledger" in found["not_running", unlisted]
    assert f"having seen generation {seen}) lists no such guest" in found["not_running", unlisted]

    lm.hosts.set_state("d", "down")
    found = {(p.kind, p.subject): p.detail for p in audit(lm.store)}
    assert set(found) == {
        ("not_running", unlisted),
        ("on_down_host", doomed),
        ("on_down_host", waiting),
    }
    assert "running on host d, which is down" in found["on_down_host", doomed]
    assert "pending on host d, which is down" in found["on_down_host", waiting]
