"""Whatever the batch, the store afterwards never exceeds a capacity and never breaks a
hard group rule; a gang is all or nothing."""

from __future__ import annotations

import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.pending import audit
from loadmaster.scheduler import RequestSpec

GROUPS = {
    "anti": "anti-affinity",
    "anti2": "anti-affinity",
    "aff": "affinity",
    "soft": "soft-anti-affinity",
}

vm_strategy = st.tuples(st.sampled_from(["tiny", "small", "big"]), st.sampled_from([None, *GROUPS]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hosts=st.lists(
        st.tuples(st.integers(2, 12), st.sampled_from(["up", "up", "maintenance"])),
        min_size=1,
        max_size=6,
    ),
    vms=st.lists(vm_strategy, min_size=1, max_size=30),
    gang=st.booleans(),
    policy=st.sampled_from(["spread", "pack", "vm-count"]),
)
def test_any_batch_keeps_every_promise(
    hosts: list[tuple[int, str]], vms: list[tuple[str, str | None]], gang: bool, policy: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lm = loadmaster.open(f"sqlite:///{Path(tmp) / 'h.db'}")
        lm.hosts.create_many(
            [
                {
                    "name": f"h{i}",
                    "state": state,
                    "inventories": {"VCPU": {"total": vcpu}, "MEMORY_MB": {"total": 8192}},
                }
                for i, (vcpu, state) in enumerate(hosts)
            ]
        )
        for name, vcpu in (("tiny", 1), ("small", 2), ("big", 4)):
            lm.flavors.create({"name": name, "resources": {"VCPU": vcpu, "MEMORY_MB": 512 * vcpu}})
        for name, group_policy in GROUPS.items():
            lm.groups.create(name, group_policy)
        uuids = [
            v.uuid
            for v in lm.vms.create_many(
                [VmSpec(f"v{i}", f, group=g) for i, (f, g) in enumerate(vms)]
            )
        ]
        result = lm.scheduler.schedule([RequestSpec(vms=uuids)], gang=gang, policy=policy)
        assert len(result.placements) == len(uuids)
        assert all(p.ok or p.error is not None for p in result.placements)
        if gang:
            assert len(result.placed) in (0, len(uuids))
        assert audit(lm.store) == []
        for usage in lm.allocations.usages().values():
            assert all(u.active + u.pending <= u.capacity for u in usage.values())
        per_group: dict[str, Counter[str]] = defaultdict(Counter)
        for vm in lm.vms.list():
            if vm.group and vm.host:
                per_group[vm.group][vm.host] += 1
        for name in ("anti", "anti2"):
            assert max(per_group[name].values(), default=0) <= 1
        assert len(per_group["aff"]) <= 1
        placed_hosts = {lm.vms.get(vm).host for vm in result.placed}
        assert all(lm.hosts.get(h).state == "up" for h in placed_hosts if h)
        lm.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # per host: VCPU on the root, and the VCPU of each NUMA child (none for a flat host)
    hosts=st.lists(
        st.tuples(st.integers(0, 8), st.lists(st.integers(1, 8), max_size=3)),
        min_size=1,
        max_size=5,
    ),
    vms=st.lists(st.sampled_from(["tiny", "small", "big", "wide"]), min_size=1, max_size=30),
    policy=st.sampled_from(["spread", "pack", "vm-count"]),
)
def test_nested_hosts_the_scheduler_decides_as_the_ledger_claims(
    hosts: list[tuple[int, list[int]]], vms: list[str], policy: str
) -> None:
    """With one scheduler, the ledger must never refuse what the scheduler chose: a refusal
    (seen as a conflict and a retry) would mean the scheduler's model of a host tree and
    the ledger's differ, e.g. capacity summed over children that no single child has."""
    with tempfile.TemporaryDirectory() as tmp:
        lm = loadmaster.open(f"sqlite:///{Path(tmp) / 'n.db'}")
        for i, (root_vcpu, children) in enumerate(hosts):
            inventories = {"MEMORY_MB": {"total": 16384}}
            if root_vcpu:
                inventories["VCPU"] = {"total": root_vcpu}
            lm.hosts.create(f"h{i}", inventories=inventories)
            for j, vcpu in enumerate(children):
                lm.hosts.create(f"h{i}-n{j}", parent=f"h{i}", inventories={"VCPU": {"total": vcpu}})
        for name, vcpu in (("tiny", 1), ("small", 2), ("big", 4), ("wide", 6)):
            lm.flavors.create({"name": name, "resources": {"VCPU": vcpu, "MEMORY_MB": 512}})
        uuids = [
            v.uuid for v in lm.vms.create_many([VmSpec(f"v{i}", f) for i, f in enumerate(vms)])
        ]
        result = lm.scheduler.schedule([RequestSpec(vms=uuids)], policy=policy)
        assert result.conflicts == 0
        assert all(p.attempts == 1 for p in result.placements)
        assert {p.error.code for p in result.placements if p.error} <= {"loadmaster.no_valid_host"}
        assert audit(lm.store) == []
        # Greedy but not blind: a VM is refused only when no single provider can take it.
        vcpu_free = max(
            (
                u["VCPU"].capacity - u["VCPU"].used
                for u in lm.allocations.usages().values()
                if "VCPU" in u
            ),
            default=0,
        )
        for p, flavor in zip(result.placements, vms, strict=True):
            if p.error is not None:
                need = {"tiny": 1, "small": 2, "big": 4, "wide": 6}[flavor]
                assert vcpu_free < need
        lm.close()
