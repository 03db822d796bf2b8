"""Moving a provider between trees (Placement's PUT with a parent): its whole subtree
moves, both trees' generations move, and nothing allocated may change hosts that way."""

from __future__ import annotations

import pytest

from loadmaster.errors import HostInUse, ValidationError
from loadmaster.service import Loadmaster


def test_a_moved_provider_takes_its_subtree_and_both_roots_see_it(lm: Loadmaster) -> None:
    a, b = lm.hosts.create("a"), lm.hosts.create("b")
    numa = lm.hosts.create("a-numa", parent=a.uuid, inventories={"VCPU": {"total": 4}})
    nic = lm.hosts.create("a-nic", parent=numa.uuid)
    lm.flavors.create({"name": "f", "resources": {"VCPU": 4}})
    assert lm.scheduler.capacity("f").per_host == {"a": 1}
    moved = lm.hosts.update(numa.uuid, "a-numa", b.uuid)
    assert moved.parent == b.uuid and moved.root == b.uuid
    assert lm.hosts.get(nic.uuid).root == b.uuid
    # As Placement: a move changes no generation (they guard inventories, traits and
    # aggregates); a scheduler's snapshot still sees both trees change, by the clock.
    assert lm.hosts.get("a").generation == a.generation
    assert lm.hosts.get("b").generation == b.generation
    assert lm.scheduler.capacity("f").per_host == {"b": 1}
    root = lm.hosts.update(numa.uuid, "a-numa", None)
    assert root.parent is None and lm.hosts.get(nic.uuid).root == numa.uuid
    with pytest.raises(ValidationError, match="loop"):
        lm.hosts.update(numa.uuid, "a-numa", nic.uuid)


def test_a_provider_with_allocations_stays_in_its_tree(lm: Loadmaster) -> None:
    lm.hosts.create("h", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}})
    other = lm.hosts.create("other")
    lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    vm = lm.vms.create("v", "f").uuid
    lm.allocations.claim(vm, "h")
    before = lm.hosts.get("h")
    with pytest.raises(HostInUse):
        lm.hosts.update("h", "h", other.uuid)
    assert lm.hosts.get("h") == before
