"""Only hosts whose agent is live are chosen, once a deployment uses agents: placements,
drain destinations and the "no valid host" explanation all follow the live-agent filter."""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import update

from loadmaster.scheduler import RequestSpec
from loadmaster.scheduler.core import Snapshot, SyntheticHost
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.service import Loadmaster
from loadmaster.store.locking import now
from loadmaster.store.schema import HostAgentRow, HostRow

NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 16384}}


def _request() -> VmRequest:
    return VmRequest(label="vm", vm=None, flavor=None, resources={"VCPU": 1})


def test_the_rule_needs_a_word_within_the_limit() -> None:
    from loadmaster.cluster.liveness import agent_live

    assert agent_live(100.0, 160.0, 60.0)
    assert not agent_live(100.0, 160.5, 60.0)
    assert not agent_live(None, 160.0, 60.0)


def test_filter_keeps_only_live_agents_and_says_why() -> None:
    from loadmaster.scheduler.core.filters.live_agent import LiveAgentFilter

    fresh = time.time()
    snap = Snapshot.of(
        [
            SyntheticHost("live", {"VCPU": 4}, agent_seen=fresh),
            SyntheticHost("silent", {"VCPU": 4}, agent_seen=fresh - 3600),
            SyntheticHost("bare", {"VCPU": 4}),
        ]
    )
    verdict = LiveAgentFilter().mask(snap, _request())
    assert verdict is not None
    assert verdict.keep.tolist() == [True, False, False]
    assert verdict.reason_at(2) == "no agent"
    assert verdict.reason_at(1).startswith("agent silent since ")
    blame = verdict.blame(~verdict.keep)
    assert blame.pop("no agent") == 1
    (silent,) = blame
    assert silent.startswith("agent silent since ") and blame[silent] == 1


def test_without_agents_every_host_is_kept() -> None:
    from loadmaster.scheduler.core.filters.live_agent import LiveAgentFilter

    snap = Snapshot.of([SyntheticHost("a", {"VCPU": 4}), SyntheticHost("b", {"VCPU": 4})])
    assert LiveAgentFilter().mask(snap, _request()) is None


def _agents(lm: Loadmaster, *names: str) -> None:
    for name in names:
        lm.host_agents.register(name, hypervisor_uri=f"test:///{name}", inventories=NODE)


def _silence(lm: Loadmaster, host: str, seconds: float = 3600) -> None:
    with lm.store.write() as session:
        host_id = session.query(HostRow.id).filter(HostRow.name == host).scalar_subquery()
        session.execute(
            update(HostAgentRow)
            .where(HostAgentRow.host_id == host_id)
            .values(last_seen_at=now() - timedelta(seconds=seconds))
        )


def test_placements_avoid_hosts_without_a_live_agent(slm: Loadmaster) -> None:
    _agents(slm, "live", "quiet")
    slm.hosts.create("bare", inventories=NODE)
    _silence(slm, "quiet")
    slm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    result = slm.scheduler.schedule([RequestSpec(flavor="small", count=8)], dry_run=True)
    assert {p.host for p in result.placements} == {"live"}
    explained = slm.scheduler.explain(RequestSpec(flavor="small", count=1))
    assert explained.candidates == 1
    (counted,) = [f for f in explained.filters if f.filter == "live_agent"]
    assert counted.removed == 2
    assert counted.reasons["no agent"] == 1
    assert any(r.startswith("agent silent since ") for r in counted.reasons)
    assert "agent silent since" in explained.message


def test_drain_never_chooses_a_host_without_a_live_agent(slm: Loadmaster) -> None:
    _agents(slm, "source", "busy")
    slm.hosts.create("bare", inventories=NODE)
    slm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    slm.flavors.create({"name": "big", "resources": {"VCPU": 6, "MEMORY_MB": 8192}})
    filler = slm.vms.create("filler", "big")
    slm.allocations.claim(filler.uuid, "busy")
    moved = slm.vms.create("moved", "small")
    slm.allocations.claim(moved.uuid, "source")
    slm.allocations.activate(moved.uuid, "source")
    slm.maintenance.drain("source")
    assert slm.vms.get(moved.uuid).target_host == "busy"


def test_the_silence_limit_is_the_agents_limit(slm: Loadmaster) -> None:
    _agents(slm, "h0")
    slm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    _silence(slm, "h0", 120)
    assert slm.host_agents.status("h0").status == "silent"
    assert (
        slm.scheduler.schedule([RequestSpec(flavor="small")], dry_run=True).placements[0].host
        is None
    )
    slm.host_agents.silent_after = timedelta(seconds=600)
    assert slm.host_agents.status("h0").status == "ok"
    assert (
        slm.scheduler.schedule([RequestSpec(flavor="small")], dry_run=True).placements[0].host
        == "h0"
    )


def test_a_pinned_start_is_still_judged_by_the_live_agent_filter(slm: Loadmaster) -> None:
    _agents(slm, "live")
    slm.hosts.create("bare", inventories=NODE)
    slm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    vm = slm.vms.create("pinned", "small").uuid
    (refused,) = slm.scheduler.start(vm, host="bare").placements
    assert refused.host is None and refused.error is not None
    assert refused.error.field == "host"
    assert "cannot start on host bare: no agent (live_agent)" in refused.error.detail
    assert slm.vms.get(vm).state == "requested"
    (placed,) = slm.scheduler.start(vm, host="live").placements
    assert placed.host == "live" and slm.vms.get(vm).host == "live"


def test_a_migration_to_a_named_host_is_judged_by_every_filter(slm: Loadmaster) -> None:
    """``vm migrate --host`` claimed on the named host without the filters: a host with no
    agent became the destination of a move no agent would ever carry out."""
    _agents(slm, "source", "quiet", "live")
    slm.hosts.create("bare", inventories=NODE)
    _silence(slm, "quiet")
    slm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    vm = slm.vms.create("moving", "small").uuid
    slm.allocations.claim(vm, "source")
    slm.allocations.activate(vm, "source")
    for host, why in (("bare", "no agent"), ("quiet", "agent silent since")):
        (refused,) = slm.scheduler.migrate(vm, host=host).placements
        assert refused.host is None and refused.error is not None
        assert refused.error.field == "host"
        assert f"cannot move to host {host}: {why}" in refused.error.detail
        moving = slm.vms.get(vm)
        assert (moving.state, moving.host, moving.target_host) == ("running", "source", None)
    (placed,) = slm.scheduler.migrate(vm, host="live").placements
    assert placed.host == "live"
    moved = slm.vms.get(vm)
    assert (moved.state, moved.host, moved.target_host) == ("migrating", "source", "live")
