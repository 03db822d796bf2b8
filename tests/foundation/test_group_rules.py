"""Hard server-group rules are the ledger's to keep, not only the scheduler's: a claim that
would break affinity, anti-affinity or max_per_host is refused and writes nothing."""

from __future__ import annotations

import pytest
from dbstate import dump

from loadmaster.errors import GroupPolicyViolation
from loadmaster.pending import Claim
from loadmaster.service import Loadmaster


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
    assert err.value.status == 409 and err.value.field == "host"
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
