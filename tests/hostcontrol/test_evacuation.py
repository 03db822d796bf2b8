"""Evacuation of a dead host: refused unless the host is known down (fenced or confirmed),
a failed fence keeps every claim, highly available VMs go first, the group rules and
pending claims bind as in every placement, evacuating again (or from two processes at
once) places nothing twice, and the host that comes back runs nothing the ledger moved."""

from __future__ import annotations

import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from tests.foundation.dbstate import dump

from loadmaster.errors import Conflict, FenceFailed, InvalidTransition
from loadmaster.hostcontrol.evacuation import AutoEvacuation, EvacuationService
from loadmaster.pending import Claim, audit, group_rule_problems
from loadmaster.service import Loadmaster
from loadmaster.store.locking import now
from loadmaster.store.schema import HostAgentRow, HostRow

NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 16384}}
# h0, the host that dies, holds more than any other host has room for.
BIG = {"VCPU": {"total": 16}, "MEMORY_MB": {"total": 16384}}


def _cluster(lm: Loadmaster, hosts: int = 3) -> None:
    for i in range(hosts):
        inventories = BIG if i == 0 else NODE
        lm.host_agents.register(f"h{i}", hypervisor_uri=f"test:///h{i}", inventories=inventories)
    lm.flavors.create({"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 2048}})
    lm.flavors.create({"name": "big", "resources": {"VCPU": 6, "MEMORY_MB": 2048}})


def _running_on(
    lm: Loadmaster, host: str, name: str, flavor: str = "small", **kwargs: object
) -> str:
    vm = lm.vms.create(name, flavor, **kwargs).uuid
    lm.allocations.claim(vm, host)
    lm.allocations.activate(vm, host)
    return vm


def _silence(lm: Loadmaster, host: str, seconds: float = 3600) -> None:
    """The host's agent was last heard ``seconds`` ago."""
    with lm.store.write() as session:
        host_id = session.query(HostRow.id).filter(HostRow.name == host).scalar()
        session.execute(
            update(HostAgentRow)
            .where(HostAgentRow.host_id == host_id)
            .values(last_seen_at=now() - timedelta(seconds=seconds))
        )


def _fence_script(tmp_path: Path, exit_code: int = 0) -> list[str]:
    """A fence command that appends the host it is given to ``fenced.log``."""
    log = tmp_path / "fenced.log"
    code = (
        "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); "
        f"print('power off refused', file=sys.stderr) if {exit_code} else None; "
        f"sys.exit({exit_code})"
    )
    return [sys.executable, "-c", code, str(log)]


def _fenced(tmp_path: Path) -> list[str]:
    log = tmp_path / "fenced.log"
    return log.read_text().split() if log.exists() else []


def _with_fence(lm: Loadmaster, command: list[str]) -> EvacuationService:
    """Another server process's evacuation service over the same store."""
    return EvacuationService(lm.store, lm.scheduler, lm.host_agents, fence_command=command)


def test_evacuate_without_confirmation_or_fence_is_refused_and_changes_nothing(
    lm: Loadmaster,
) -> None:
    _cluster(lm)
    _running_on(lm, "h0", "web")
    _silence(lm, "h0")
    before = dump(lm)
    with pytest.raises(Conflict) as err:
        lm.evacuation.evacuate("h0")
    assert err.value.field == "confirm_down"
    assert "not known to be down" in err.value.detail
    assert "loadmaster host evacuate h0 --confirm-down" in err.value.detail
    assert dump(lm) == before


def test_evacuate_is_refused_while_the_agent_is_heard_even_when_confirmed(
    lm: Loadmaster,
) -> None:
    _cluster(lm)
    _running_on(lm, "h0", "web")
    before = dump(lm)
    with pytest.raises(Conflict) as err:
        lm.evacuation.evacuate("h0", confirm_down=True)
    assert "host drain h0" in err.value.detail and err.value.field == "host"
    assert dump(lm) == before


def test_a_failed_fence_keeps_every_claim_and_a_good_one_evacuates(
    lm: Loadmaster, tmp_path: Path
) -> None:
    _cluster(lm)
    vm = _running_on(lm, "h0", "web")
    _silence(lm, "h0")
    before = dump(lm)
    failing = _with_fence(lm, _fence_script(tmp_path, exit_code=3))
    with pytest.raises(FenceFailed) as err:
        failing.evacuate("h0")
    assert "exited 3: power off refused" in err.value.detail
    assert "claims are kept" in err.value.detail
    assert _fenced(tmp_path) == ["h0"]
    assert dump(lm) == before
    assert lm.vms.get(vm).host == "h0" and lm.vms.get(vm).state == "running"

    result = _with_fence(lm, _fence_script(tmp_path)).evacuate("h0")
    assert result.known_down == "fenced" and set(result.moved) == {vm}
    assert lm.hosts.get("h0").state == "down"
    moved = lm.vms.get(vm)
    assert moved.state == "pending" and moved.host in ("h1", "h2")
    assert lm.allocations.allocations(host="h0") == []
    assert audit(lm.store) == []


def test_highly_available_vms_are_placed_first_when_room_is_short(lm: Loadmaster) -> None:
    _cluster(lm, hosts=2)
    plain = _running_on(lm, "h0", "a-plain", "big")
    low = _running_on(lm, "h0", "b-ha-low", "small", tags=["ha"])
    high = _running_on(lm, "h0", "c-ha-high", "big", tags=["ha", "priority:9"])
    _silence(lm, "h0")
    result = lm.evacuation.evacuate("h0", confirm_down=True)
    assert result.known_down == "confirmed"
    assert result.order == (high, low, plain)
    # h1 has 8 VCPU: the two highly available VMs (6 + 2) fill it; the plain one waits.
    assert result.moved == {high: "h1", low: "h1"}
    (left,) = result.unplaced
    assert left.vm == plain and left.error.code == "loadmaster.no_valid_host"
    stays = lm.vms.get(plain)
    assert (stays.state, stays.host) == ("running", "h0")
    # Each VM says why it moved, or why it runs nowhere; evacuating again keeps it.
    lm.evacuation.evacuate("h0")
    assert {lm.vms.get(vm).fault for vm in (high, low)} == {
        "host h0 is down (confirmed): evacuated"
    }
    fault = lm.vms.get(plain).fault or ""
    assert fault.startswith("host h0 is down (confirmed): no other host fits it yet (")
    assert fault.endswith("evacuated when room is found")
    # The ledger is whole; the audit names the VM that runs nowhere until placed again.
    assert [(p.kind, p.subject) for p in audit(lm.store)] == [("on_down_host", plain)]


def test_evacuating_again_places_only_what_is_left_and_never_twice(lm: Loadmaster) -> None:
    _cluster(lm, hosts=2)
    first = _running_on(lm, "h0", "first", "big")
    second = _running_on(lm, "h0", "second", "big")
    _silence(lm, "h0")
    result = lm.evacuation.evacuate("h0", confirm_down=True)
    assert set(result.moved) == {first} and [u.vm for u in result.unplaced] == [second]
    # The pending VM starts and room is made on h1: the next evacuation places the rest.
    lm.allocations.activate(first, "h1")
    lm.hosts.set_inventories("h1", {"VCPU": {"total": 16}, "MEMORY_MB": {"total": 16384}})
    again = lm.evacuation.evacuate("h0")
    assert again.known_down == "already" and again.moved == {second: "h1"}
    assert lm.vms.get(first).state == "running"
    last = lm.evacuation.evacuate("h0")
    assert (last.moved, last.unplaced, last.order) == ({}, (), ())
    assert audit(lm.store) == []


def test_an_evacuate_claim_for_a_vm_no_longer_on_a_down_host_is_refused(lm: Loadmaster) -> None:
    _cluster(lm)
    vm = _running_on(lm, "h0", "web")
    with pytest.raises(InvalidTransition) as err:
        lm.allocations.claim_many([Claim(vm, "h1", intent="evacuate")])
    assert "not on a host that is down" in err.value.detail


def test_two_processes_evacuating_at_once_place_each_vm_once(lm: Loadmaster) -> None:
    _cluster(lm, hosts=4)
    vms = [_running_on(lm, "h0", f"vm-{i}") for i in range(4)]
    _silence(lm, "h0")
    lm.hosts.set_state("h0", "down")
    others = [_with_fence(lm, []) for _ in range(2)]
    results: list[dict[str, str]] = []
    barrier = threading.Barrier(2)

    def evacuate(service: EvacuationService) -> None:
        barrier.wait()
        results.append(service.evacuate("h0").moved)

    threads = [threading.Thread(target=evacuate, args=(s,)) for s in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 2
    placed = [vm for moved in results for vm in moved]
    assert sorted(placed) == sorted(vms)  # each VM claimed by exactly one of them
    for vm in vms:
        assert lm.vms.get(vm).state == "pending" and lm.vms.get(vm).host != "h0"
    assert audit(lm.store) == []


def test_group_rules_bind_the_evacuation(lm: Loadmaster) -> None:
    _cluster(lm, hosts=3)
    lm.groups.create("spread", "anti-affinity")
    on_h0 = _running_on(lm, "h0", "a", group="spread")
    _running_on(lm, "h1", "b", group="spread")
    _silence(lm, "h0")
    result = lm.evacuation.evacuate("h0", confirm_down=True)
    assert result.moved == {on_h0: "h2"}
    assert group_rule_problems(lm.store) == []


def test_the_automatic_pass_fences_a_silent_host_once_whatever_the_processes(
    lm: Loadmaster, tmp_path: Path
) -> None:
    _cluster(lm)
    vm = _running_on(lm, "h0", "web", tags=["ha"])
    command = _fence_script(tmp_path)
    servers = [_with_fence(lm, command) for _ in range(3)]
    assert [s.run_pass() for s in servers] == [[], [], []]  # every agent heard
    _silence(lm, "h0")
    done = [r for s in servers for r in s.run_pass()]
    assert _fenced(tmp_path) == ["h0"]
    assert [(r.host, r.known_down, r.moved) for r in done] == [
        ("h0", "fenced", {vm: lm.vms.get(vm).host})
    ]
    assert lm.vms.get(vm).host != "h0"
    assert [r for s in servers for r in s.run_pass()] == []
    assert _fenced(tmp_path) == ["h0"]


def test_a_failed_automatic_fence_is_tried_again_only_after_the_threshold(
    lm: Loadmaster, tmp_path: Path
) -> None:
    _cluster(lm)
    vm = _running_on(lm, "h0", "web")
    lm.host_agents.silent_after = timedelta(seconds=30)
    failing = EvacuationService(
        lm.store,
        lm.scheduler,
        lm.host_agents,
        fence_command=_fence_script(tmp_path, exit_code=1),
        fence_timeout_s=30,
    )
    _silence(lm, "h0", seconds=40)
    assert failing.run_pass() == [] and failing.run_pass() == []
    assert _fenced(tmp_path) == ["h0"]
    assert lm.vms.get(vm).host == "h0" and lm.hosts.get("h0").state == "up"
    with lm.store.write() as session:  # the failed try is now more than 60 s old
        session.execute(update(HostAgentRow).values(fence_claimed_at=now() - timedelta(seconds=61)))
    assert failing.run_pass() == []
    assert _fenced(tmp_path) == ["h0", "h0"]


def test_the_host_that_comes_back_stays_down_and_is_given_nothing_moved_away(
    lm: Loadmaster,
) -> None:
    _cluster(lm)
    vm = _running_on(lm, "h0", "web", tags=["ha"])
    _silence(lm, "h0")
    lm.evacuation.evacuate("h0", confirm_down=True)
    # Its agent comes back, still running the guest (a network partition, not a crash).
    lm.host_agents.register("h0", hypervisor_uri="test:///h0", inventories=BIG)
    work = lm.host_agents.work("h0")
    assert (work.state, work.items) == ("down", ())
    said = lm.host_agents.report("h0", [vm], seen_generation=work.generation)
    assert said.unexpected == (vm,) and said.activated == ()
    assert lm.hosts.get("h0").state == "down"
    assert lm.vms.get(vm).host != "h0"


def test_the_server_thread_waits_a_grace_before_its_first_pass(
    lm: Loadmaster, tmp_path: Path
) -> None:
    """After every server was away, each agent's last word is old: a pass at once would
    fence the fleet. Stopping interrupts the grace; with none, the silent host is fenced."""
    _cluster(lm)
    _silence(lm, "h0")
    service = _with_fence(lm, _fence_script(tmp_path))
    waiting = AutoEvacuation(service, every_s=0.05)
    assert waiting.grace_s == 60 + 10 + 2  # the threshold, a held poll's refresh, a flush
    waiting.start()
    time.sleep(0.5)
    waiting.stop()
    assert _fenced(tmp_path) == [] and lm.hosts.get("h0").state == "up"
    running = AutoEvacuation(service, every_s=0.05, grace_s=0)
    running.start()
    try:
        _wait_down(lm, "h0")
    finally:
        running.stop()
    assert _fenced(tmp_path) == ["h0"] and lm.hosts.get("h0").state == "down"


def test_a_host_heard_since_the_start_and_then_silent_is_fenced_within_the_grace(
    lm: Loadmaster, tmp_path: Path
) -> None:
    """The grace spares hosts this process has not heard yet, not one it heard die: a host
    dying just after a server (re)start is evacuated a threshold after its last word,
    not a whole grace later."""
    _cluster(lm)
    _silence(lm, "h0")
    lm.host_agents.silent_after = timedelta(seconds=1)
    service = _with_fence(lm, _fence_script(tmp_path))
    auto = AutoEvacuation(service, every_s=0.05)
    assert auto.grace_s == 1 + 10 + 2
    auto.start()
    try:
        time.sleep(0.2)
        lm.host_agents.report("h1", None)  # heard after the start, then silent
        _wait_down(lm, "h1")
        time.sleep(0.5)  # passes go on: h0, silent since before the start, still waits
    finally:
        auto.stop()
    assert _fenced(tmp_path) == ["h1"]
    assert [lm.hosts.get(h).state for h in ("h0", "h1", "h2")] == ["up", "down", "up"]


def _wait_down(lm: Loadmaster, host: str) -> None:
    deadline = time.monotonic() + 60
    while lm.hosts.get(host).state != "down" and time.monotonic() < deadline:
        time.sleep(0.05)


def test_hosts_dying_together_are_evacuated_in_one_batch_ha_first_across_them(
    lm: Loadmaster, tmp_path: Path
) -> None:
    _cluster(lm, hosts=5)
    lm.hosts.set_inventories("h1", BIG)
    plain = _running_on(lm, "h0", "plain", "big")  # the first host a pass would look at
    ha = _running_on(lm, "h1", "ha", "big", tags=["ha"])
    # Room for one big VM in all, on h2.
    _running_on(lm, "h2", "filler-2", "small")
    _running_on(lm, "h3", "filler-3", "big")
    _running_on(lm, "h4", "filler-4", "big")
    _silence(lm, "h0")
    _silence(lm, "h1")
    results = _with_fence(lm, _fence_script(tmp_path)).run_pass()
    assert sorted(_fenced(tmp_path)) == ["h0", "h1"]
    by_host = {r.host: r for r in results}
    assert by_host["h1"].moved == {ha: "h2"} and by_host["h1"].unplaced == ()
    assert by_host["h0"].moved == {} and [u.vm for u in by_host["h0"].unplaced] == [plain]
    assert lm.vms.get(plain).host == "h0"  # still claimed there, for the next pass
    assert [(p.kind, p.subject) for p in audit(lm.store)] == [("on_down_host", plain)]


def test_no_host_is_fenced_when_most_agents_are_silent_at_once(
    lm: Loadmaster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two of three silent at once: this server more likely lost the network (or is
    overloaded) than two hosts died; fencing them would kill healthy hosts."""
    _cluster(lm, hosts=3)
    vm = _running_on(lm, "h0", "web")
    _silence(lm, "h0")
    _silence(lm, "h1")
    service = _with_fence(lm, _fence_script(tmp_path))
    assert service.run_pass() == []
    assert _fenced(tmp_path) == [] and lm.vms.get(vm).host == "h0"
    assert "2 of 3 hosts' agents are silent" in caplog.text and "none fenced" in caplog.text
    lm.host_agents.register("h1", hypervisor_uri="test:///h1", inventories=NODE)  # heard
    assert [r.host for r in service.run_pass()] == ["h0"]
    assert _fenced(tmp_path) == ["h0"]
