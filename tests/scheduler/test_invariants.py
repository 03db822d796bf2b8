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
