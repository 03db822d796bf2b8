"""Hard server-group rules are the ledger's to keep, not only the scheduler's: a claim that
would break affinity, anti-affinity or max_per_host is refused and writes nothing."""

from __future__ import annotations

from collections import Counter

import pytest
from dbstate import dump
from hypothesis import given, settings
from hypothesis import strategies as st

from loadmaster.api.errors import status_of
from loadmaster.errors import (
    ConcurrentUpdate,
    GroupPolicyViolation,
    InvalidTransition,
    ValidationError,
)
from loadmaster.pending import Claim, audit
from loadmaster.pending.group_rules import GroupRules
from loadmaster.service import Loadmaster
from loadmaster.store.schema import HostRow, ServerGroupRow, VmRow


@pytest.fixture
def cluster(lm: Loadmaster) -> Loadmaster:
    for name in ("h0", "h1", "h2"):
        lm.hosts.create(name, inventories={"VCPU": {"total": 16}, "MEMORY_MB": {"total": 16384}})
    lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    lm.groups.create("together", "affinity")
    lm.groups.create("apart", "anti-affinity")
    lm.groups.create("two-max", "soft-anti-affinity", max_per_host=2)
    return lm


def _vms(lm: Loadmaster, group: str, count: int) -> list[str]:
    return [lm.vms.create(f"{group}-{i}", "f", group=group).uuid for i in range(count)]


def _refused(lm: Loadmaster, vm: str, host: str) -> GroupPolicyViolation:
    before = dump(lm)
    with pytest.raises(GroupPolicyViolation) as err:
        lm.allocations.claim(vm, host)
    assert status_of(err.value) == 409 and err.value.field == "host"
    assert dump(lm) == before
    return err.value


def test_affinity_members_follow_the_first(cluster: Loadmaster) -> None:
    lm = cluster
    a, b, c = _vms(lm, "together", 3)
    lm.allocations.claim(a, "h0")  # pending counts: the first member is not up yet
    error = _refused(lm, b, "h1")
    assert "affinity group together" in error.detail and "h1" in error.detail
    lm.allocations.claim(b, "h0")
    lm.allocations.activate(a)
    _refused(lm, c, "h2")
    # Once every member is gone the group may start over anywhere.
    lm.allocations.delete(a)
    lm.allocations.stop(b)
    lm.allocations.claim(c, "h2")


def test_anti_affinity_one_member_per_host(cluster: Loadmaster) -> None:
    lm = cluster
    a, b = _vms(lm, "apart", 2)
    lm.allocations.claim(a, "h0")
    error = _refused(lm, b, "h0")
    assert "1 member(s) of anti-affinity group apart" in error.detail
    lm.allocations.claim(b, "h1")
    lm.allocations.activate(b)
    # A migration's destination counts too: a cannot move next to b.
    lm.allocations.activate(a)
    _refused(lm, a, "h1")
    lm.allocations.claim(a, "h2")
    assert lm.vms.get(a).state == "migrating"


def test_max_per_host_caps_a_soft_group(cluster: Loadmaster) -> None:
    lm = cluster
    a, b, c = _vms(lm, "two-max", 3)
    lm.allocations.claim(a, "h0")
    lm.allocations.claim(b, "h0")
    _refused(lm, c, "h0")
    lm.allocations.claim(c, "h1")


def test_a_batch_sees_its_own_earlier_claims(cluster: Loadmaster) -> None:
    lm = cluster
    a, b = _vms(lm, "together", 2)
    before = dump(lm)
    with pytest.raises(GroupPolicyViolation) as err:
        lm.allocations.claim_many([Claim(a, "h0"), Claim(b, "h1")])
    assert err.value.field == "claims[1].host"
    assert dump(lm) == before  # the gang wrote nothing
    outcomes = lm.allocations.claim_many([Claim(a, "h0"), Claim(b, "h1")], all_or_nothing=False)
    assert [o.error is None for o in outcomes] == [True, False]
    assert isinstance(outcomes[1].error, GroupPolicyViolation)
    c, d = _vms(lm, "apart", 2)
    outcomes = lm.allocations.claim_many([Claim(c, "h2"), Claim(d, "h2")], all_or_nothing=False)
    assert [o.error is None for o in outcomes] == [True, False]


def test_an_affinity_group_moves_through_migrating_members(cluster: Loadmaster) -> None:
    """A migrating member counts on its source and its destination: the group may move
    from h0 to h1 member by member, and meanwhile it may grow only where all are headed."""
    lm = cluster
    a, b, c = _vms(lm, "together", 3)
    for vm in (a, b):
        lm.allocations.claim(vm, "h0")
        lm.allocations.activate(vm)
    lm.allocations.claim(a, "h1")  # a: h0 -> h1, b still only on h0
    assert lm.vms.get(a).state == "migrating"
    _refused(lm, c, "h1")  # b is only on h0: a new member on h1 would split the group
    lm.allocations.claim(b, "h1")  # now both are on h0 and headed to h1
    _refused(lm, c, "h2")
    lm.allocations.claim(c, "h1")
    lm.allocations.activate(a)
    lm.allocations.activate(b)
    assert {lm.vms.get(v).host for v in (a, b, c)} == {"h1"}


def test_a_pending_vm_is_re_placed_in_one_transaction(cluster: Loadmaster) -> None:
    lm = cluster
    (a,) = _vms(lm, "apart", 1)
    lm.allocations.claim(a, "h0")
    # Without ``move`` a pending VM already holds a claim.
    before = dump(lm)
    with pytest.raises(InvalidTransition):
        lm.allocations.claim(a, "h1")
    with pytest.raises(ValidationError):
        lm.allocations.claim_many([Claim(a, "h0", move=True)])
    assert dump(lm) == before
    lm.allocations.claim_many([Claim(a, "h1", move=True)])
    vm = lm.vms.get(a)
    assert (vm.state, vm.host, vm.target_host) == ("pending", "h1", None)
    assert {r.host for r in lm.allocations.allocations(vm=a)} == {"h1"}
    assert audit(lm.store) == []


def test_pending_affinity_members_move_together_or_not_at_all(cluster: Loadmaster) -> None:
    lm = cluster
    a, b = _vms(lm, "together", 2)
    lm.allocations.claim_many([Claim(a, "h0"), Claim(b, "h0")])
    # Alone, a cannot leave b behind; in one batch both move.
    with pytest.raises(GroupPolicyViolation):
        lm.allocations.claim_many([Claim(a, "h1", move=True)])
    lm.allocations.claim_many([Claim(a, "h1", move=True), Claim(b, "h1", move=True)])
    assert {lm.vms.get(v).host for v in (a, b)} == {"h1"}
    # A batch that would land one and not the other is a race to decide again: nothing lands.
    before = dump(lm)
    with pytest.raises(ConcurrentUpdate):
        lm.allocations.claim_many(
            [Claim(a, "h2", move=True), Claim(b, "nowhere", move=True)], all_or_nothing=False
        )
    assert dump(lm) == before


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),  # VM
            st.sampled_from(["requested", "pending", "running"]),
            st.integers(0, 3),  # its host now (if placed)
            st.integers(0, 3),  # the host it is claimed on
        ),
        max_size=30,
    ),
    st.integers(1, 3),
)
def test_counted_limit_agrees_with_walking_the_members(
    steps: list[tuple[int, str, int, int]], limit: int
) -> None:
    """``check`` counts a group's members per host instead of walking them all (a batch of
    a 1,000-member group); after any sequence of landed claims, including migrations that
    count on two hosts and a VM claimed again, it refuses exactly when the walk says the
    host already holds ``limit`` other members."""
    group = ServerGroupRow(id=1, name="g", policy="soft-anti-affinity", max_per_host=limit)
    rules = GroupRules({1: group}, {1: {}}, {1: Counter()})
    hosts = [HostRow(id=h, name=f"h{h}") for h in range(4)]
    for vm_id, state, now_on, claimed_on in steps:
        vm = VmRow(id=vm_id, uuid=f"vm-{vm_id}", group_id=1, state=state)
        vm.host_id = None if state == "requested" else now_on
        host = hosts[claimed_on]
        walked = sum(host.id in on for other, on in rules.members[1].items() if other != vm_id)
        if walked >= limit:
            with pytest.raises(GroupPolicyViolation):
                rules.check(vm, host)
            continue
        rules.check(vm, host)
        rules.add(vm, host)
