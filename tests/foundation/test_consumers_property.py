"""Whatever sequence of Placement-style allocation writes (on plain consumers and on VMs'
consumers) and loadmaster VM calls (claim, up, release, stop, migrate by hand), the
ledger stays whole: the audit is clean (no provider over capacity with pending counted,
no VM whose state contradicts its records, no consumer that is no VM holding pending
records), and a refused call changes nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.foundation.dbstate import dump

import loadmaster
from loadmaster.errors import LoadmasterError
from loadmaster.pending import audit
from loadmaster.pending.consumers import ConsumerWrite
from loadmaster.service import Loadmaster

HOSTS = ("h0", "h1")
VMS = 4
PLAIN = [str(uuid.UUID(int=i + 1)) for i in range(3)]


def _do(
    lm: Loadmaster, step: tuple[str, int, int, int], vms: list[str], uuids: dict[str, str]
) -> None:
    kind, i, j, amount = step
    vm, host = vms[i % VMS], HOSTS[j % len(HOSTS)]
    if kind == "claim":
        lm.allocations.claim(vm, host)
    elif kind == "up":
        lm.allocations.activate(vm)
    elif kind == "release":
        lm.allocations.release(vm)
    elif kind == "stop":
        lm.allocations.stop(vm)
    elif kind == "migrate-by-hand":
        lm.allocations.claim(vm, host, intent="migrate")
    elif kind == "placement-plain":
        amounts = {"VCPU": amount} if amount else {}
        allocations = {uuids[host]: amounts} if amounts else {}
        lm.allocations.write_consumers(
            [ConsumerWrite(PLAIN[i % len(PLAIN)], allocations, "p", "u")]
        )
    elif kind == "placement-vm":
        # A Placement client writing a VM's consumer: its flavor's amounts, or others.
        resources = {"VCPU": 2, "MEMORY_MB": 1024} if amount % 2 else {"VCPU": amount}
        allocations = {uuids[host]: resources} if amount else {}
        lm.allocations.write_consumers([ConsumerWrite(vm, allocations, "p", "u")])


STEPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["claim", "up", "release", "stop", "migrate-by-hand", "placement-plain", "placement-vm"]
        ),
        st.integers(0, 20),
        st.integers(0, 20),
        st.integers(0, 6),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
# Two plain consumers filling one provider, then a VM claim there: capacity with both.
@example(steps=[("placement-plain", 0, 0, 5), ("placement-plain", 1, 0, 5), ("claim", 0, 0, 0)])
# A VM started, then moved by a Placement write, then written empty (a release).
@example(steps=[("claim", 0, 0, 0), ("placement-vm", 0, 1, 1), ("placement-vm", 0, 0, 0)])
def test_placement_writes_and_vm_calls_keep_the_ledger_whole(
    tmp_path: Path, steps: list[tuple[str, int, int, int]]
) -> None:
    lm = loadmaster.open(f"sqlite:///{tmp_path / f'mix-{uuid.uuid4().hex}.db'}")
    try:
        uuids = {
            name: lm.hosts.create(
                name,
                inventories={"VCPU": {"total": 6}, "MEMORY_MB": {"total": 4096}},
                traits=["HW_CPU_X86_AVX2"] if name == "h0" else [],
            ).uuid
            for name in HOSTS
        }
        flavor = {"name": "f", "resources": {"VCPU": 2, "MEMORY_MB": 1024}}
        lm.flavors.create({**flavor, "required_traits": ["HW_CPU_X86_AVX2"]})
        vms = [lm.vms.create(f"v{i}", "f").uuid for i in range(VMS)]
        for step in steps:
            before = dump(lm)
            try:
                _do(lm, step, vms, uuids)
            except LoadmasterError:
                assert dump(lm) == before, step  # refused: nothing changed
            assert audit(lm.store) == [], step
            # The flavor requires a trait only h0 has: no VM is ever held on h1.
            assert all(a.host == "h0" for a in lm.allocations.allocations() if a.vm in vms)
    finally:
        lm.close()
