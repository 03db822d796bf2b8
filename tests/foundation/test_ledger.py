"""Claims, activation, release, migration and reconciliation against a real database."""

from __future__ import annotations

from datetime import timedelta

import pytest

from loadmaster.errors import ConcurrentUpdate, Conflict, InsufficientCapacity, InvalidTransition
from loadmaster.pending import Claim
from loadmaster.service import Loadmaster
from loadmaster.store.locking import now


@pytest.fixture
def two_hosts(lm: Loadmaster) -> Loadmaster:
    for name in ("h1", "h2"):
        lm.hosts.create(name, inventories={"VCPU": {"total": 4}, "MEMORY_MB": {"total": 4096}})
    lm.flavors.create({"name": "half", "resources": {"VCPU": 2, "MEMORY_MB": 2048}})
    return lm


def running(lm: Loadmaster, name: str, flavor: str, host: str) -> str:
    """A new VM running on ``host`` (claimed there, then activated): its uuid."""
    uuid = lm.vms.create(name, flavor).uuid
    lm.allocations.claim(uuid, host)
    lm.allocations.activate(uuid)
    return uuid


def test_claim_is_all_classes_or_none(lm: Loadmaster) -> None:
    lm.hosts.create("h", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 1024}})
    lm.flavors.create({"name": "big", "resources": {"VCPU": 2, "MEMORY_MB": 2048}})
    vm = lm.vms.create("v", "big")
    with pytest.raises(InsufficientCapacity) as err:
        lm.allocations.claim(vm.uuid, "h")
    assert err.value.field == "resources.MEMORY_MB"
    assert "needs 2048, 1024 free" in err.value.detail
    assert lm.allocations.allocations() == []
    assert lm.vms.get(vm.uuid).state == "requested"


def test_pending_counts_as_used_and_activate_turns_it_active(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    a, b, c = (lm.vms.create(n, "half") for n in "abc")
    lm.allocations.claim(a.uuid, "h1")
    lm.allocations.claim(b.uuid, "h1")
    with pytest.raises(InsufficientCapacity):
        lm.allocations.claim(c.uuid, "h1")
    assert lm.allocations.pending_for_host("h1") == {"VCPU": 4, "MEMORY_MB": 4096}
    lm.allocations.activate(a.uuid)
    lm.allocations.activate(a.uuid)  # a second "VM up" report changes nothing
    usage = lm.allocations.usages(["h1"])["h1"]["VCPU"]
    assert (usage.active, usage.pending, usage.free) == (2, 2, 0)
    assert lm.vms.get(a.uuid).state == "running"
    assert lm.vms.get(b.uuid).state == "pending"


def test_release_twice_is_harmless(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    a, b = lm.vms.create("a", "half"), lm.vms.create("b", "half")
    lm.allocations.claim(a.uuid, "h1")
    lm.allocations.claim(b.uuid, "h1")
    assert lm.allocations.release(a.uuid) == 2
    generation = lm.hosts.get("h1").generation
    assert lm.allocations.release(a.uuid) == 0
    assert lm.hosts.get("h1").generation == generation
    assert lm.allocations.pending_for_host("h1") == {"VCPU": 2, "MEMORY_MB": 2048}
    assert lm.vms.get(a.uuid).state == "requested"


def test_migration_is_active_on_source_plus_pending_on_destination(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    vm = running(lm, "m", "half", "h1")
    lm.allocations.claim(vm, "h2")
    record = lm.vms.get(vm)
    assert (record.state, record.host, record.target_host) == ("migrating", "h1", "h2")
    assert lm.allocations.pending_for_vm(vm) == {"h2": {"VCPU": 2, "MEMORY_MB": 2048}}
    assert lm.allocations.usages(["h1"])["h1"]["VCPU"].active == 2
    lm.allocations.activate(vm)
    record = lm.vms.get(vm)
    assert (record.state, record.host, record.target_host) == ("running", "h2", None)
    assert lm.allocations.usages(["h1"])["h1"]["VCPU"].used == 0
    assert lm.allocations.usages(["h2"])["h2"]["VCPU"].active == 2


def test_aborted_migration_keeps_the_source(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    vm = running(lm, "m", "half", "h1")
    lm.allocations.claim(vm, "h2")
    with pytest.raises(InvalidTransition):
        lm.allocations.release(vm, "h1")  # the source may not vanish mid-flight
    assert lm.allocations.release(vm, "h2") == 2
    record = lm.vms.get(vm)
    assert (record.state, record.host, record.target_host) == ("running", "h1", None)


def test_illegal_transitions_are_refused(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    vm = lm.vms.create("v", "half")
    with pytest.raises(InvalidTransition):
        lm.allocations.activate(vm.uuid)  # requested, never placed
    with pytest.raises(InvalidTransition):
        lm.allocations.stop(vm.uuid)
    lm.allocations.claim(vm.uuid, "h1")
    with pytest.raises(InvalidTransition):
        lm.allocations.claim(vm.uuid, "h2")  # already holds a pending claim
    lm.allocations.delete(vm.uuid)
    with pytest.raises(InvalidTransition):
        lm.allocations.claim(vm.uuid, "h1")
    assert lm.allocations.allocations() == []


def test_stopped_vm_can_start_again(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    vm = running(lm, "v", "half", "h1")
    assert lm.allocations.stop(vm).state == "stopped"
    assert lm.allocations.allocations() == []
    lm.allocations.claim(vm, "h2")
    assert lm.vms.get(vm).state == "pending"


def test_no_claims_on_hosts_out_of_service(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    lm.hosts.set_state("h1", "maintenance")
    vm = lm.vms.create("v", "half")
    with pytest.raises(Conflict) as err:
        lm.allocations.claim(vm.uuid, "h1")
    assert "maintenance" in err.value.detail


def test_expected_generation_is_a_compare_and_swap(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    seen = lm.hosts.get("h1").generation
    a, b = lm.vms.create("a", "half"), lm.vms.create("b", "half")
    lm.allocations.claim(a.uuid, "h1", expected_generation=seen)
    with pytest.raises(ConcurrentUpdate):
        lm.allocations.claim(b.uuid, "h1", expected_generation=seen)
    assert lm.vms.get(b.uuid).state == "requested"


def test_gang_claim_writes_nothing_on_failure(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    vms = [lm.vms.create(f"v{i}", "half") for i in range(3)]
    claims = [Claim(v.uuid, "h1") for v in vms]
    with pytest.raises(InsufficientCapacity) as err:
        lm.allocations.claim_many(claims, all_or_nothing=True)
    assert err.value.field == "claims[2].resources.MEMORY_MB"
    assert lm.allocations.allocations() == []
    outcomes = lm.allocations.claim_many(claims, all_or_nothing=False)
    assert [o.ok for o in outcomes] == [True, True, False]
    assert {v.state for v in lm.vms.list()} == {"pending", "requested"}


def test_reconcile_follows_the_host_report(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    started, never_started, running_gone = (lm.vms.create(n, "half") for n in ("s", "n", "r"))
    lm.hosts.set_inventories("h1", {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}})
    for vm in (started, never_started, running_gone):
        lm.allocations.claim(vm.uuid, "h1")
    lm.allocations.activate(running_gone.uuid)
    stranger = "22222222-2222-4222-8222-222222222222"
    result = lm.allocations.reconcile("h1", [started.uuid, stranger])
    assert result.activated == (started.uuid,)
    assert result.released == (never_started.uuid,)
    assert result.stopped == (running_gone.uuid,)
    assert result.unexpected == (stranger,)
    assert lm.vms.get(never_started.uuid).state == "requested"
    assert lm.vms.get(running_gone.uuid).state == "stopped"
    assert lm.allocations.pending_for_host("h1") == {}


def test_reconcile_spares_claims_newer_than_the_report(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    vm = lm.vms.create("v", "half")
    lm.allocations.claim(vm.uuid, "h1")
    # The host listed its VMs a minute ago, before this claim: that proves nothing.
    result = lm.allocations.reconcile("h1", [], as_of=now() - timedelta(minutes=1))
    assert result.released == ()
    assert lm.vms.get(vm.uuid).state == "pending"


def test_reconcile_spares_vms_that_came_up_after_the_report(two_hosts: Loadmaster) -> None:
    """The host listed its VMs, then one started (activate) and another finished its
    migration here: the report predates both and proves neither gone."""
    lm = two_hosts
    listed_at = now()
    started, moved = lm.vms.create("s", "half"), lm.vms.create("m", "half")
    lm.allocations.claim(started.uuid, "h1")
    lm.allocations.claim(moved.uuid, "h2")
    lm.allocations.activate(moved.uuid)
    lm.allocations.claim(moved.uuid, "h1")
    lm.allocations.activate(started.uuid)
    lm.allocations.activate(moved.uuid)
    result = lm.allocations.reconcile("h1", [], as_of=listed_at)
    assert result.stopped == () and result.released == ()
    assert {lm.vms.get(v.uuid).state for v in (started, moved)} == {"running"}
    # A report taken after they came up does prove them gone.
    result = lm.allocations.reconcile("h1", [])
    assert sorted(result.stopped) == sorted([started.uuid, moved.uuid])


def test_reconcile_leaves_a_migration_in_flight_to_its_executor(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    vm = running(lm, "v", "half", "h1")
    lm.allocations.claim(vm, "h2")  # migrating h1 -> h2
    before = lm.allocations.allocations(vm=vm)
    # Neither the destination (not switched over yet, or already listing the incoming VM)
    # nor the source (listing it or not) ends the migration.
    for host, present in (("h2", []), ("h2", [vm]), ("h1", []), ("h1", [vm])):
        result = lm.allocations.reconcile(host, present)
        assert result.activated == result.released == result.stopped == ()
    assert lm.vms.get(vm).state == "migrating"
    assert lm.allocations.allocations(vm=vm) == before
    lm.allocations.activate(vm)  # the executor completes it
    assert lm.vms.get(vm).host == "h2"


def test_child_providers_carry_their_own_classes(lm: Loadmaster) -> None:
    lm.hosts.create("h", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}})
    lm.hosts.create("h-nic0", parent="h", inventories={"SRIOV_NET_VF": {"total": 2}})
    lm.hosts.create("h-nic1", parent="h", inventories={"SRIOV_NET_VF": {"total": 2}})
    lm.flavors.create(
        {"name": "net", "resources": {"VCPU": 1, "MEMORY_MB": 512, "SRIOV_NET_VF": 2}}
    )
    vms = [lm.vms.create(f"v{i}", "net") for i in range(3)]
    lm.allocations.claim(vms[0].uuid, "h")
    lm.allocations.claim(vms[1].uuid, "h")
    with pytest.raises(InsufficientCapacity):
        lm.allocations.claim(vms[2].uuid, "h")
    hosts = {a.host for a in lm.allocations.allocations() if a.resource_class == "SRIOV_NET_VF"}
    assert hosts == {"h-nic0", "h-nic1"}
    assert lm.hosts.get("h-nic0").root == lm.hosts.get("h").uuid
    with pytest.raises(Conflict):
        lm.hosts.delete("h")  # children first


def test_custom_class_lifecycle(lm: Loadmaster) -> None:
    rc = lm.resource_classes.create(
        "CUSTOM_LICENSE_WIN", kind="license", unit="seat", description="Windows"
    )
    assert (
        lm.resource_classes.create(
            "CUSTOM_LICENSE_WIN", kind="license", unit="seat", description="Windows"
        )
        == rc
    )
    with pytest.raises(Conflict):
        lm.resource_classes.create("CUSTOM_LICENSE_WIN", kind="license", unit="core")
    assert "CUSTOM_LICENSE_WIN" in {r.name for r in lm.resource_classes.list()}
    lm.resource_classes.delete("CUSTOM_LICENSE_WIN")
    assert "CUSTOM_LICENSE_WIN" not in {r.name for r in lm.resource_classes.list()}


def test_project_usage(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    a = lm.vms.create("a", "half", project_id="p1")
    b = lm.vms.create("b", "half", project_id="p1")
    lm.vms.create("c", "half", project_id="p2")
    lm.allocations.claim(a.uuid, "h1")
    lm.allocations.claim(b.uuid, "h2")
    lm.allocations.activate(a.uuid)
    assert lm.allocations.project_usage("p1")["VCPU"] == {"active": 2, "pending": 2}
    assert lm.allocations.project_usage("p2") == {}


def test_stopping_a_vm_that_never_started(two_hosts: Loadmaster) -> None:
    lm = two_hosts
    vm = lm.vms.create("v", "half")
    lm.allocations.claim(vm.uuid, "h1")
    assert lm.allocations.stop(vm.uuid).state == "stopped"
    assert lm.allocations.allocations() == []
    lm.allocations.claim(vm.uuid, "h2")  # a stopped VM starts again anywhere


def test_a_migration_claimed_or_aborted_moves_its_source_too(two_hosts: Loadmaster) -> None:
    """The source's work changes (run -> migrate_out, and back on an abort): its agent,
    long-polling the source's generation, must hear of it at once."""
    lm = two_hosts
    vm = running(lm, "v", "half", "h1")
    before = lm.hosts.get("h1").generation
    lm.allocations.claim(vm, "h2")
    assert lm.hosts.get("h1").generation == before + 1
    lm.allocations.release(vm, "h2")
    assert lm.vms.get(vm).state == "running"
    assert lm.hosts.get("h1").generation == before + 2
