"""Lifecycle edges (issue 13, defect 9), on both databases: start is not a migration,
classes named by live VMs stay, deleted VMs outlive their flavor, a VM that asks for
nothing is refused, and a vanished host is a 404, not a KeyError."""

from __future__ import annotations

from typing import Any

import pytest
from dbstate import dump
from sqlalchemy import update

from loadmaster.errors import Conflict, InvalidTransition, NotFound, ValidationError
from loadmaster.pending import claims as claims_module
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster
from loadmaster.store.schema import VmRow


@pytest.fixture
def cluster(lm: Loadmaster) -> Loadmaster:
    lm.resource_classes.create("CUSTOM_FPGA")
    for name in ("h1", "h2"):
        lm.hosts.create(
            name,
            inventories={
                "VCPU": {"total": 8},
                "MEMORY_MB": {"total": 8192},
                "CUSTOM_FPGA": {"total": 2},
            },
        )
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    return lm


def test_start_on_a_running_vm_is_refused_not_a_migration(cluster: Loadmaster) -> None:
    lm = cluster
    vm = lm.vms.create("v", "small").uuid
    lm.allocations.claim(vm, "h1", intent="start")
    lm.allocations.activate(vm)
    before = dump(lm)
    result = lm.scheduler.schedule([RequestSpec(vms=[vm])], intent="start")
    assert isinstance(result.placements[0].error, InvalidTransition)
    with pytest.raises(InvalidTransition, match="already running"):
        lm.allocations.claim(vm, "h2", intent="start")
    assert dump(lm) == before
    assert lm.vms.get(vm).state == "running"


def test_only_a_running_vm_migrates_checked_in_the_ledger(cluster: Loadmaster) -> None:
    lm = cluster
    vm = lm.vms.create("v", "small").uuid
    before = dump(lm)
    with pytest.raises(InvalidTransition, match="only a running VM migrates"):
        lm.allocations.claim(vm, "h2", intent="migrate")
    result = lm.scheduler.schedule([RequestSpec(vms=[vm])], intent="migrate")
    assert isinstance(result.placements[0].error, InvalidTransition)
    assert dump(lm) == before
    lm.allocations.claim(vm, "h1", intent="start")
    lm.allocations.activate(vm)
    lm.allocations.claim(vm, "h2", intent="migrate")
    assert lm.vms.get(vm).state == "migrating"


@pytest.mark.parametrize("state", ["requested", "stopped"])
def test_a_class_named_in_live_overrides_cannot_be_deleted(cluster: Loadmaster, state: str) -> None:
    lm = cluster
    vm = lm.vms.create("v", "small", overrides={"CUSTOM_FPGA": 1}).uuid
    if state == "stopped":
        lm.allocations.claim(vm, "h1")
        lm.allocations.activate(vm)
        lm.allocations.stop(vm)
    for host in ("h1", "h2"):  # no inventory names it any more: only the VM does
        lm.hosts.delete_inventory(host, "CUSTOM_FPGA")
    with pytest.raises(Conflict, match=f"overrides of VM {vm}"):
        lm.resource_classes.delete("CUSTOM_FPGA")
    lm.allocations.delete(vm)
    lm.resource_classes.delete("CUSTOM_FPGA")  # a deleted VM holds nothing back


def test_deleting_a_flavor_keeps_its_deleted_vms(cluster: Loadmaster) -> None:
    lm = cluster
    lm.flavors.create({"name": "gone", "resources": {"VCPU": 1}})
    vm = lm.vms.create("v", "gone").uuid
    lm.allocations.delete(vm)
    lm.flavors.delete("gone")
    again = lm.allocations.delete(vm)  # a retried DELETE /vms/{uuid}
    assert again.state == "deleted" and again.flavor is None
    assert lm.vms.get(vm).state == "deleted"
    with pytest.raises(InvalidTransition):
        lm.allocations.claim(vm, "h1")


def test_a_vm_that_asks_for_nothing_is_refused(cluster: Loadmaster) -> None:
    lm = cluster
    before = dump(lm)
    with pytest.raises(ValidationError) as err:
        lm.vms.create("v", "small", overrides={"VCPU": 0, "MEMORY_MB": 0})
    assert err.value.field == "overrides"
    assert dump(lm) == before


def test_a_pending_vm_without_records_is_released_and_never_claimed_empty(
    cluster: Loadmaster,
) -> None:
    """A VM from before such VMs were refused: it must not be stuck pending."""
    lm = cluster
    vm = lm.vms.create("v", "small").uuid
    with lm.store.write() as session:
        session.execute(
            update(VmRow).where(VmRow.uuid == vm).values(overrides={"VCPU": 0, "MEMORY_MB": 0})
        )
    with pytest.raises(ValidationError, match="no resource"):
        lm.allocations.claim(vm, "h1")
    with lm.store.write() as session:
        session.execute(update(VmRow).where(VmRow.uuid == vm).values(state="pending"))
    lm.allocations.release(vm)
    assert lm.vms.get(vm).state == "requested"


def test_a_host_deleted_between_two_reads_is_not_found(
    cluster: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = cluster
    vm = lm.vms.create("v", "small").uuid
    # What READ COMMITTED lets happen: the host row was read, then its tree was gone.
    monkeypatch.setattr(claims_module, "load_trees", lambda *_a, **_k: {})
    with pytest.raises(NotFound, match="deleted meanwhile"):
        lm.allocations.claim(vm, "h1")
    outcomes: Any = lm.allocations.claim_many([claims_module.Claim(vm, "h1")], all_or_nothing=False)
    assert isinstance(outcomes[0].error, NotFound)
