"""A scheduler's snapshot, refreshed by the cluster clock, equals one loaded from scratch,
whatever another process wrote meanwhile: claims (with and without a compare-and-swap),
moves of pending VMs, activations, releases, migrations, inventory, trait, state and name
changes, providers added, moved and deleted."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loadmaster
from loadmaster.errors import LoadmasterError
from loadmaster.pending import Claim
from loadmaster.scheduler.core.snapshot import ARRAYS, Snapshot
from loadmaster.scheduler.reports import record_report
from loadmaster.scheduler.source import SnapshotSource
from loadmaster.service import Loadmaster

HOSTS = ("h0", "h1", "h2")
VMS = 6


def _view(state: Snapshot) -> dict[str, object]:
    order = np.argsort(state.provider_ids)
    return {
        "names": state.names,
        "providers": [state.provider_names[i] for i in order],
        "generation": state.generation[order].tolist(),
        "status": state.status[order].tolist(),
        "capacity": state.capacity[:, order].tolist(),
        "used": state.used[:, order].tolist(),
        "vm_count": state.vm_count.tolist(),
        # By name: a snapshot may keep a column for a trait no provider has any more.
        "traits": [
            sorted(name for name, t in state.traits.items() if state.trait_matrix[row, t])
            for row in order
        ],
        "tree": [[state.provider_names[r] for r in rows] for rows in state.tree],
    }


def _do(lm: Loadmaster, step: tuple[str, int, int], vms: list[str]) -> None:
    kind, i, j = step
    vm, host = vms[i % VMS], HOSTS[j % len(HOSTS)]
    if kind == "claim":
        lm.allocations.claim(vm, host)
    elif kind == "move":
        lm.allocations.claim_many([Claim(vm, host, move=True)])
    elif kind == "up":
        lm.allocations.activate(vm)
    elif kind == "release":
        lm.allocations.release(vm)
    elif kind == "inventory":
        lm.hosts.set_inventory(host, "VCPU", {"total": 4 + i % 8})
    elif kind == "trait":
        lm.hosts.set_traits(host, ["HW_CPU_X86_AVX2"] if i % 2 else [])
    elif kind == "state":
        lm.hosts.set_state(host, "up" if i % 3 else "maintenance")
    elif kind == "rename":
        lm.hosts.update(host, host, None)  # the same name: a no-op must stay one
    elif kind == "child":
        parent = lm.hosts.get(host)
        lm.hosts.create(f"{host}-n{i}", parent=parent.uuid, inventories={"VCPU": {"total": 2}})
    elif kind == "drop-child":
        for h in lm.hosts.list():
            if h.parent is not None and h.root == lm.hosts.get(host).uuid:
                lm.hosts.delete(h.uuid)
                break


STEPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "claim",
                "move",
                "up",
                "release",
                "inventory",
                "trait",
                "state",
                "rename",
                "child",
                "drop-child",
            ]
        ),
        st.integers(0, 50),
        st.integers(0, 50),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_a_refreshed_snapshot_equals_a_fresh_one(
    tmp_path: Path, steps: list[tuple[str, int, int]]
) -> None:
    url = f"sqlite:///{tmp_path / f'fresh-{uuid.uuid4().hex}.db'}"  # one per example
    writer = loadmaster.open(url)
    reader = loadmaster.open(url)  # another process's scheduler, as far as the store knows
    try:
        for name in HOSTS:
            writer.hosts.create(
                name, inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}
            )
        writer.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
        vms = [writer.vms.create(f"v{i}", "f").uuid for i in range(VMS)]
        cached = SnapshotSource(reader.store)
        cached.refresh()
        for step in steps:
            # Refused steps change nothing; the snapshot must agree with that too.
            with contextlib.suppress(LoadmasterError):
                _do(writer, step, vms)
            fresh = SnapshotSource(reader.store).refresh()
            assert _view(cached.refresh()) == _view(fresh), step
            assert _read_only(cached.snapshot), step
    finally:
        writer.close()
        reader.close()


def _read_only(state: Snapshot) -> bool:
    arrays = [getattr(state, name) for name in ARRAYS] + list(state.group_members.values())
    return not any(array.flags.writeable for array in arrays)


def test_the_kept_snapshot_is_read_only_after_every_kind_of_change(tmp_path: Path) -> None:
    """The source thaws the arrays only for what it writes (most refreshes write nothing)
    and freezes them again: plugins and questions never see a writable array. Each step
    alone, so that no later write's freeze covers an earlier one's."""
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'frozen.db'}")
    try:
        inventories = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}
        for name in HOSTS:
            lm.hosts.create(name, inventories=inventories)
        lm.groups.create("apart", "anti-affinity")
        source = SnapshotSource(lm.store)
        steps = {
            "full load, no agent, no report": lambda: source.refresh(),
            "nothing changed": lambda: source.refresh(),
            "a provider reloaded": lambda: (
                lm.hosts.set_inventory("h1", "VCPU", {"total": 16}),
                source.refresh(),
            ),
            "an agent read": lambda: (
                lm.host_agents.register("h2", hypervisor_uri="test:///h2", inventories=inventories),
                source.refresh(),
            ),
            "a report read": lambda: (
                record_report(lm.store, "h0", {}, {"cpu": 0.5}, None),
                source.reported(),
                source.refresh(),
            ),
            # (Last: a registration reloads all, which counts no group until one is named.)
            "group members counted": lambda: source.load_groups([lm.groups.get("apart")], {}),
            "a claim landed": lambda: source.landed(
                [(0, {"VCPU": 1}, "apart", False, None, (), ())], None
            ),
        }
        for step, change in steps.items():
            change()
            assert _read_only(source.snapshot), step
        snap = source.snapshot
        assert snap.agents_in_use and not np.isnan(snap.load).all()  # every step took effect
        assert snap.group_members["apart"].tolist() == [1, 0, 0]
        assert snap.capacity[snap.classes["VCPU"]].tolist() == [8, 16, 8]
    finally:
        lm.close()
