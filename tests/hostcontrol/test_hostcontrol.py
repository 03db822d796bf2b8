"""The control plane's side of host agents: registration, work lists, claims judged by
sequence (never by clocks), launch and migration failures."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update

from loadmaster.errors import Conflict, LoadmasterError, ValidationError
from loadmaster.pending import audit
from loadmaster.quota import Quota
from loadmaster.service import Loadmaster
from loadmaster.store.schema import FlavorRow, HostAgentRow, HostReportRow, HostRow

NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}
FAR_FUTURE = datetime(2999, 1, 1)


def _cluster(lm: Loadmaster, hosts: int = 3) -> None:
    for i in range(hosts):
        lm.host_agents.register(f"h{i}", hypervisor_uri=f"test:///h{i}", inventories=NODE)
    lm.flavors.create({"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 2048}})


def _pending_on(lm: Loadmaster, host: str, name: str = "vm") -> str:
    vm = lm.vms.create(name, "small")
    lm.allocations.claim(vm.uuid, host)
    return vm.uuid


def test_register_creates_then_updates_with_numa_children(lm: Loadmaster) -> None:
    children = {"h0_numa0": {"VCPU": {"total": 4}}, "h0_numa1": {"VCPU": {"total": 4}}}
    first = lm.host_agents.register(
        "h0",
        hypervisor_uri="qemu:///h0",
        inventories={"CUSTOM_LICENSE_X": {"total": 4}},
        children=children,
    )
    assert first.refused == {}
    assert set(first.host.inventories) == {"CUSTOM_LICENSE_X"}
    assert lm.hosts.get("h0_numa1").parent == first.host.uuid
    assert lm.hosts.get("h0_numa1").inventories["VCPU"].total == 4
    again = lm.host_agents.register(
        "h0", hypervisor_uri="qemu:///h0", inventories={"CUSTOM_LICENSE_X": {"total": 6}}
    )
    assert again.host.inventories["CUSTOM_LICENSE_X"].total == 6
    assert again.host.generation > first.host.generation
    assert lm.host_agents.status("h0").status == "ok"
    assert lm.host_agents.status("h0").hypervisor_uri == "qemu:///h0"


def test_register_never_shrinks_below_what_is_allocated(lm: Loadmaster) -> None:
    _cluster(lm, 1)
    for i in range(3):
        _pending_on(lm, "h0", f"vm{i}")  # 6 VCPU, 6144 MB
    result = lm.host_agents.register(
        "h0",
        hypervisor_uri="test:///h0",
        inventories={"VCPU": {"total": 4}, "MEMORY_MB": {"total": 16384}},
    )
    assert list(result.refused) == ["h0.VCPU"]
    assert "below the 6 allocated" in result.refused["h0.VCPU"]
    # The refused class kept its inventory; the other one still changed.
    assert result.host.inventories["VCPU"].total == 8
    assert result.host.inventories["MEMORY_MB"].total == 16384
    assert audit(lm.store) == []


def test_bad_registration_changes_nothing(lm: Loadmaster) -> None:
    with pytest.raises(ValidationError) as err:
        lm.host_agents.register(
            "h9",
            hypervisor_uri="test:///h9",
            inventories=NODE,
            children={"h9_numa0": {"VCPU": {"total": -1}}},
        )
    assert err.value.field is not None and "children.h9_numa0" in err.value.field
    assert lm.hosts.list() == []
    with pytest.raises(ValidationError) as err:
        lm.host_agents.register("h9", hypervisor_uri="", inventories=NODE)
    assert err.value.field == "hypervisor_uri"


def test_work_list_says_what_to_do_with_each_vm(lm: Loadmaster) -> None:
    _cluster(lm, 2)
    launching = _pending_on(lm, "h0", "a")
    running = _pending_on(lm, "h0", "b")
    lm.allocations.activate(running)
    moving = _pending_on(lm, "h0", "c")
    lm.allocations.activate(moving)
    lm.allocations.claim(moving, "h1")
    work = lm.host_agents.work("h0")
    actions = {i.vm: i.action for i in work.items}
    assert actions == {launching: "launch", running: "run", moving: "migrate_out"}
    out = next(i for i in work.items if i.vm == moving)
    assert (out.target_host, out.target_uri) == ("h1", "test:///h1")
    assert (out.memory_mb, out.vcpus) == (2048, 2)
    assert {i.vm: i.action for i in lm.host_agents.work("h1").items} == {moving: "migrate_in"}
    assert work.generation == lm.hosts.get("h0").generation


def test_a_stored_quota_spec_no_longer_accepted_leaves_the_work_list_whole(
    lm: Loadmaster,
) -> None:
    """A flavor kept with a warning before its quota specs were checked: its VMs still get
    on their hosts' work lists, without the quota it was told is not applied."""
    _cluster(lm, 1)
    lm.flavors.create(
        {
            "name": "capped",
            "resources": {"VCPU": 1, "MEMORY_MB": 512},
            "extra_specs": {"quota:cpu_shares": "512"},
        }
    )
    old = lm.vms.create("old", "small")
    capped = lm.vms.create("capped", "capped")
    for vm in (old, capped):
        lm.allocations.claim(vm.uuid, "h0")
    with lm.store.write() as session:
        session.execute(
            update(FlavorRow)
            .where(FlavorRow.name == "small")
            .values(extra_specs={"quota:cpu_limit": "1000"})
        )
    quotas = {i.name: i.quota for i in lm.host_agents.work("h0").items}
    assert quotas == {"old": Quota(), "capped": Quota(cpu={"shares": 512})}


def test_tag_change_moves_the_hosts_generation(lm: Loadmaster) -> None:
    _cluster(lm, 1)
    vm = _pending_on(lm, "h0")
    before = lm.host_agents.generation("h0")
    lm.vms.set_tags(vm, ["gold"])
    assert lm.host_agents.generation("h0") > before
    assert lm.host_agents.work("h0").items[0].tags == ("gold",)


def test_slow_launch_keeps_its_claim_whatever_the_clocks(lm: Loadmaster) -> None:
    _cluster(lm, 1)
    vm = _pending_on(lm, "h0")
    seen = lm.host_agents.generation("h0")
    # A report from a host whose clock runs centuries ahead, still launching the VM.
    result = lm.host_agents.report("h0", [], launching=[vm], seen_generation=seen, as_of=FAR_FUTURE)
    assert result.released == ()
    assert lm.vms.get(vm).state == "pending"
    # Once the agent knew of it and neither runs nor launches it, the claim ends.
    result = lm.host_agents.report("h0", [], seen_generation=seen)
    assert result.released == (vm,)
    assert lm.vms.get(vm).state == "requested"
    assert "neither running nor launching" in (lm.vms.get(vm).fault or "")
    assert audit(lm.store) == []


def test_a_vm_its_host_reports_gone_is_stopped_with_the_reason(
    lm: Loadmaster, caplog: pytest.LogCaptureFixture
) -> None:
    """A running VM its host's agent no longer lists ends stopped, and says why: in its
    fault, in its event, and in a log line."""
    _cluster(lm, 1)
    vm = _pending_on(lm, "h0")
    lm.allocations.activate(vm)
    seen = lm.host_agents.generation("h0")
    with caplog.at_level(logging.WARNING, logger="loadmaster.pending.ledger"):
        result = lm.host_agents.report("h0", [], seen_generation=seen)
    assert result.stopped == (vm,)
    record = lm.vms.get(vm)
    assert record.state == "stopped"
    assert record.fault == "host h0 reported it not running: its agent lists no such guest"
    last = lm.vms.events(vm=vm)[-1]
    assert (last.old_state, last.state, last.fault) == ("running", "stopped", record.fault)
    assert [r.getMessage() for r in caplog.records] == [
        f"VM {vm} ended by its host's report: {record.fault}"
    ]
    assert audit(lm.store) == []


def test_claim_newer_than_what_the_agent_saw_is_left_alone(lm: Loadmaster) -> None:
    _cluster(lm, 1)
    seen = lm.host_agents.generation("h0")
    vm = _pending_on(lm, "h0")
    result = lm.host_agents.report("h0", [], seen_generation=seen, as_of=FAR_FUTURE)
    assert result.released == ()
    assert lm.vms.get(vm).state == "pending"


def test_running_vm_gone_is_stopped_only_if_the_agent_knew_it_ran(lm: Loadmaster) -> None:
    _cluster(lm, 1)
    old, new = _pending_on(lm, "h0", "old"), _pending_on(lm, "h0", "new")
    lm.allocations.activate(old)
    seen = lm.host_agents.generation("h0")
    lm.allocations.activate(new)  # came up after the agent's last read
    result = lm.host_agents.report("h0", [], seen_generation=seen)
    assert result.stopped == (old,)
    assert lm.vms.get(new).state == "running"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    skew=st.integers(min_value=-(10**6), max_value=10**6),
    launching=st.booleans(),
    claim_after_read=st.booleans(),
)
def test_reports_by_sequence_ignore_the_clock(
    lm: Loadmaster, skew: int, launching: bool, claim_after_read: bool
) -> None:
    """Property: with a seen generation, the outcome depends on what the agent knew and
    said, never on ``as_of``."""
    if not lm.hosts.list():
        _cluster(lm, 1)
    for vm in lm.vms.list():
        lm.allocations.delete(vm.uuid)
    if claim_after_read:
        seen = lm.host_agents.generation("h0")
        vm = _pending_on(lm, "h0")
    else:
        vm = _pending_on(lm, "h0")
        seen = lm.host_agents.generation("h0")
    as_of = datetime(2026, 1, 1) + timedelta(seconds=skew)
    result = lm.host_agents.report(
        "h0", [], launching=[vm] if launching else [], seen_generation=seen, as_of=as_of
    )
    expect_released = not launching and not claim_after_read
    assert (vm in result.released) == expect_released
    assert lm.vms.get(vm).state == ("requested" if expect_released else "pending")


def test_refused_launch_lands_elsewhere_then_gives_up(lm: Loadmaster) -> None:
    _cluster(lm, 3)
    vm = _pending_on(lm, "h0")
    first = lm.host_agents.launch_failed(vm, "h0", "no /dev/vfio here")
    assert first.kind == "launch"
    assert first.placement is not None and first.placement.host in ("h1", "h2")
    assert lm.vms.get(vm).state == "pending"
    assert "no /dev/vfio here" in (lm.vms.get(vm).fault or "")
    second_host = first.placement.host
    # Saying it again about a claim that already ended changes nothing.
    assert lm.host_agents.launch_failed(vm, "h0", "again").kind is None
    assert lm.vms.get(vm).host == second_host
    second = lm.host_agents.launch_failed(vm, second_host, "out of memory")
    assert second.placement is not None
    third_host = second.placement.host
    assert third_host not in ("h0", second_host)
    third = lm.host_agents.launch_failed(vm, third_host, "broken")
    assert third.placement is None
    final = lm.vms.get(vm)
    assert final.state == "requested"
    assert final.fault is not None and "gave up after 3 hosts" in final.fault
    assert audit(lm.store) == []


def test_failed_migration_rolls_back(lm: Loadmaster) -> None:
    _cluster(lm, 2)
    vm = _pending_on(lm, "h0")
    lm.allocations.activate(vm)
    lm.allocations.claim(vm, "h1")
    outcome = lm.host_agents.migration_failed(vm, "h0", "connection refused")
    assert outcome.kind == "migration"
    after = lm.vms.get(vm)
    assert (after.state, after.host, after.target_host) == ("running", "h0", None)
    assert lm.allocations.allocations(host="h1") == []
    assert lm.host_agents.migration_failed(vm, "h0", "again").kind is None
    assert audit(lm.store) == []


def test_failure_needs_a_reason(lm: Loadmaster) -> None:
    _cluster(lm, 1)
    vm = _pending_on(lm, "h0")
    with pytest.raises(ValidationError) as err:
        lm.host_agents.launch_failed(vm, "h0", " ")
    assert err.value.field == "reason"
    assert lm.vms.get(vm).state == "pending"


def test_silent_agent_is_shown_and_keeps_its_claims(lm: Loadmaster) -> None:
    _cluster(lm, 1)
    vm = _pending_on(lm, "h0")
    lm.host_agents.silent_after = timedelta(seconds=0)
    assert lm.host_agents.status("h0").status == "silent"
    assert lm.vms.get(vm).state == "pending"
    lm.hosts.create("bare", inventories=NODE)
    assert lm.host_agents.status("bare").status == "none"


def test_registering_a_child_name_under_another_parent_is_refused(lm: Loadmaster) -> None:
    _cluster(lm, 2)
    lm.host_agents.register(
        "h0", hypervisor_uri="x", inventories=NODE, children={"h0_cell": {"VCPU": {"total": 1}}}
    )
    with pytest.raises(LoadmasterError) as err:
        lm.host_agents.register(
            "h1", hypervisor_uri="y", inventories=NODE, children={"h0_cell": {"VCPU": {"total": 1}}}
        )
    assert isinstance(err.value, Conflict)


def test_claims_waiting_on_hosts_that_cannot_act_are_found_and_kept(lm: Loadmaster) -> None:
    lm.hosts.create("bare", inventories=NODE)
    lm.flavors.create({"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 2048}})
    lm.waiting.warn_after = timedelta(0)
    on_bare = _pending_on(lm, "bare", "early")
    assert lm.waiting.find() == []  # no agent anywhere: nothing is held against "bare"
    for i in range(2):
        lm.host_agents.register(f"h{i}", hypervisor_uri=f"test:///h{i}", inventories=NODE)
    on_live = _pending_on(lm, "h0", "live")
    on_silent = _pending_on(lm, "h1", "quiet")
    lm.host_agents.silent_after = timedelta(seconds=3600)
    assert [w.vm for w in lm.waiting.find()] == [on_bare]
    assert "host bare has no agent" in lm.waiting.find()[0].warning
    with lm.store.write() as session:
        session.execute(
            update(HostAgentRow)
            .where(
                HostAgentRow.host_id
                == select(HostRow.id).where(HostRow.name == "h1").scalar_subquery()
            )
            .values(last_seen_at=datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=2))
        )
    found = lm.waiting.find()
    assert [w.vm for w in found] == [on_bare, on_silent]
    assert "the agent of host h1 is silent since" in found[1].warning
    assert [w.vm for w in lm.waiting.find(host="h1")] == [on_silent]
    assert lm.waiting.find(vms=[on_live]) == []
    lm.waiting.warn_after = timedelta(hours=1)
    assert lm.waiting.find() == []
    assert {lm.vms.get(v).state for v in (on_bare, on_live, on_silent)} == {"pending"}


def test_a_hosts_first_reports_arriving_together_are_all_taken(lm: Loadmaster) -> None:
    """On PostgreSQL two first reports each inserted the host's report row, and the second
    insert was refused (409: a duplicate key)."""
    hosts, together = 6, 6
    _cluster(lm, hosts)
    refused: list[BaseException] = []

    def report(host: str, start: threading.Barrier, cpu: float) -> None:
        start.wait(timeout=60)
        try:
            lm.host_agents.report(host, None, usage={"VCPU": cpu}, load={"cpu": cpu / 8})
        except BaseException as exc:
            refused.append(exc)

    for i in range(hosts):
        start = threading.Barrier(together)
        threads = [
            threading.Thread(target=report, args=(f"h{i}", start, float(n)))
            for n in range(together)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert refused == []
    with lm.store.read() as session:
        reports = {r.host_id: r for r in session.scalars(select(HostReportRow))}
    assert len(reports) == hosts
    # Each kept one of the reports whole: its usage and load from the same one.
    for kept in reports.values():
        assert kept.load == {"cpu": kept.usage["VCPU"] / 8}
