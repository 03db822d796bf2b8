"""The ledger's history of VMs (issue 26): every committed change of a VM's state, host or
migration target is one event, with the failure that caused it; a transaction that fails
leaves none. The demo's account is counted from these events, not from samples."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import select

from loadmaster.errors import LoadmasterError
from loadmaster.pending import Claim
from loadmaster.service import Loadmaster
from loadmaster.store.schema import HostRow


@pytest.fixture
def cluster(lm: Loadmaster) -> Loadmaster:
    for name in ("h1", "h2"):
        lm.hosts.create(name, inventories={"VCPU": {"total": 4}, "MEMORY_MB": {"total": 4096}})
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    return lm


def test_each_change_of_a_vm_is_one_event_with_the_failure_behind_it(cluster: Loadmaster) -> None:
    lm = cluster
    vm = lm.vms.create("v", "small").uuid
    other = lm.vms.create("w", "small").uuid
    lm.allocations.claim(vm, "h1")
    lm.allocations.fail(vm, "h1", "host h1 has 0 MiB free")
    lm.allocations.claim(vm, "h2")
    lm.allocations.activate(vm, "h2")
    lm.allocations.claim(vm, "h1", intent="migrate")
    lm.allocations.fail(vm, "h2", "the link broke")
    lm.allocations.claim(vm, "h1", intent="migrate")
    lm.allocations.activate(vm, "h1")
    lm.allocations.fail(vm, "h1", "said twice: nothing left to undo")
    lm.allocations.stop(vm)
    lm.allocations.claim(other, "h1")

    events = lm.vms.events(vm=vm)
    assert [(e.old_state, e.state, e.old_host, e.host, e.old_target, e.target) for e in events] == [
        ("requested", "pending", None, "h1", None, None),
        ("pending", "requested", "h1", None, None, None),
        ("requested", "pending", None, "h2", None, None),
        ("pending", "running", "h2", "h2", None, None),
        ("running", "migrating", "h2", "h2", None, "h1"),
        ("migrating", "running", "h2", "h2", "h1", None),
        ("running", "migrating", "h2", "h2", None, "h1"),
        # One event for the whole activation, though it swaps the host before the state.
        ("migrating", "running", "h2", "h1", "h1", None),
        ("running", "stopped", "h1", None, None, None),
    ]
    assert [e.fault for e in events] == [
        None,
        "launch on h1 failed: host h1 has 0 MiB free",
        None,
        None,
        None,
        "migration on h2 failed: the link broke",
        None,
        None,
        None,
    ]
    assert {e.name for e in events} == {"v"} and {e.vm for e in events} == {vm}
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert all(a.at <= b.at for a, b in itertools.pairwise(events))
    everything = lm.vms.events()
    assert [e.name for e in everything] == ["v"] * 9 + ["w"]
    assert lm.vms.events(after=events[-1].id) == everything[-1:]


def test_a_write_that_fails_leaves_no_event(cluster: Loadmaster) -> None:
    lm = cluster
    vms = [lm.vms.create(f"v{i}", "small").uuid for i in range(5)]
    # A gang of five on a host with room for four: the last one fails, so none lands.
    with pytest.raises(LoadmasterError):
        lm.allocations.claim_many([Claim(vm, "h1") for vm in vms])
    assert {v.state for v in lm.vms.list()} == {"requested"}
    assert lm.vms.events() == []


def test_a_claims_core_transaction_tells_listeners_only_when_it_commits(
    cluster: Loadmaster,
) -> None:
    """Claims run on ``Store.transaction`` (a Core connection, no ORM session): its events
    and its listeners as a session's, and nothing at all when it fails."""
    lm = cluster
    heard: list[frozenset[int]] = []
    stop = lm.store.listen(heard.append)
    vms = [lm.vms.create(f"v{i}", "small").uuid for i in range(5)]
    with pytest.raises(LoadmasterError):
        lm.allocations.claim_many([Claim(vm, "h1") for vm in vms])
    assert heard == []
    lm.allocations.claim_many([Claim(vms[0], "h2")])
    stop()
    with lm.store.read() as session:
        h2 = session.scalar(select(HostRow.id).where(HostRow.name == "h2"))
    assert heard == [frozenset({h2})]
    assert [(e.state, e.host) for e in lm.vms.events(vm=vms[0])] == [("pending", "h2")]
