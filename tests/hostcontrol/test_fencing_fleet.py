"""Fencing that never takes healthy hosts (issue #40): the fleet judged as a whole when
agents fall silent a few seconds apart, the threshold held above what liveness
guarantees, fences bounded in time, output and children, side by side, retried with
backoff and reported; migrations with a dead end taken over, and ``ha`` VMs first
across passes."""

from __future__ import annotations

import logging
import os
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from tests.foundation.dbstate import dump

from loadmaster.errors import Conflict, FenceFailed, ValidationError
from loadmaster.hostcontrol.evacuation import FENCE_OUTPUT_LIMIT, AutoEvacuation, EvacuationService
from loadmaster.pending import audit
from loadmaster.service import Loadmaster
from loadmaster.store.locking import now
from loadmaster.store.schema import HostAgentRow, HostRow

NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 16384}}
THRESHOLD_S = 30.0


def _fleet(lm: Loadmaster, hosts: int) -> None:
    for i in range(hosts):
        lm.host_agents.register(f"h{i}", hypervisor_uri=f"test:///h{i}", inventories=NODE)
    lm.flavors.create({"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 2048}})
    lm.flavors.create({"name": "big", "resources": {"VCPU": 6, "MEMORY_MB": 2048}})
    lm.host_agents.silent_after = timedelta(seconds=THRESHOLD_S)


def _running_on(lm: Loadmaster, host: str, name: str, flavor: str = "small", **kw: object) -> str:
    vm = lm.vms.create(name, flavor, **kw).uuid
    lm.allocations.claim(vm, host)
    lm.allocations.activate(vm, host)
    return vm


def _heard_ago(lm: Loadmaster, host: str, seconds: float) -> None:
    with lm.store.write() as session:
        host_id = session.scalar(select(HostRow.id).where(HostRow.name == host))
        session.execute(
            update(HostAgentRow)
            .where(HostAgentRow.host_id == host_id)
            .values(last_seen_at=now() - timedelta(seconds=seconds))
        )


def _recorder(tmp_path: Path, body: str = "") -> list[str]:
    """A fence command (a shell script) that logs each host it is given, then runs
    ``body`` (with ``$1`` the host)."""
    script = tmp_path / "fence.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {tmp_path / "fenced.log"}\n{body}\n')
    script.chmod(0o755)
    return [str(script)]


def _fenced(tmp_path: Path) -> list[str]:
    log = tmp_path / "fenced.log"
    return log.read_text().split() if log.exists() else []


def _service(lm: Loadmaster, command: list[str], timeout_s: float = 60.0) -> EvacuationService:
    return EvacuationService(
        lm.store, lm.scheduler, lm.host_agents, fence_command=command, fence_timeout_s=timeout_s
    )


# -- the fleet rule -------------------------------------------------------------------------
@pytest.mark.parametrize("silent", [16, 9])
def test_agents_cut_off_together_are_not_fenced_a_few_at_a_time(
    lm: Loadmaster, tmp_path: Path, caplog: pytest.LogCaptureFixture, silent: int
) -> None:
    """``silent`` of 16 agents cut off at once: their silences are recorded up to 12 s
    apart (a held poll is written every 10 s, then flushed), so the first pass past the
    threshold saw two of them, fenced them, and the next passes a few more each. Counted
    together (the others are well past half the threshold), none is fenced, pass after
    pass, until they all are past the threshold."""
    _fleet(lm, 16)
    vm = _running_on(lm, "h0", "web")
    service = _service(lm, _recorder(tmp_path))
    for step in range(5):
        for i in range(silent):  # h0 silent longest: 2 s past the threshold at first
            _heard_ago(lm, f"h{i}", THRESHOLD_S + 2 + 3 * step - 12 * i / (silent - 1))
        assert service.run_pass() == []
    assert _fenced(tmp_path) == []
    assert all(lm.hosts.get(f"h{i}").state == "up" for i in range(16))
    assert lm.vms.get(vm).host == "h0" and lm.vms.get(vm).state == "running"
    assert f"{silent} of 16 hosts' agents are silent" in caplog.text


def test_a_few_hosts_dying_apart_from_the_rest_are_fenced(lm: Loadmaster, tmp_path: Path) -> None:
    """The rule holds back only when most of the fleet is silent: two dead hosts among
    sixteen live ones are fenced, in one pass, and their VM placed."""
    _fleet(lm, 16)
    vm = _running_on(lm, "h0", "web")
    _heard_ago(lm, "h0", THRESHOLD_S + 2)
    _heard_ago(lm, "h1", THRESHOLD_S + 1)
    results = _service(lm, _recorder(tmp_path)).run_pass()
    assert sorted(_fenced(tmp_path)) == ["h0", "h1"]
    assert {r.host: r.known_down for r in results} == {"h0": "fenced", "h1": "fenced"}
    assert lm.vms.get(vm).host not in ("h0", "h1")


def test_hosts_fenced_within_the_threshold_still_count_as_silent(
    lm: Loadmaster, tmp_path: Path
) -> None:
    """Eight of sixteen were fenced a moment ago; a ninth falls silent: nine of sixteen
    are silent, so it is not fenced (counted over the hosts still up alone, one of
    eight, it was)."""
    _fleet(lm, 16)
    for i in range(8):
        lm.hosts.set_state(f"h{i}", "down")
    with lm.store.write() as session:  # the eight down ones: fenced just now
        down = select(HostRow.id).where(HostRow.state == "down")
        session.execute(
            update(HostAgentRow)
            .where(HostAgentRow.host_id.in_(down))
            .values(fence_claimed_at=now() - timedelta(seconds=1))
        )
    _heard_ago(lm, "h9", THRESHOLD_S + 1)
    assert _service(lm, _recorder(tmp_path)).run_pass() == []
    assert _fenced(tmp_path) == [] and lm.hosts.get("h9").state == "up"


# -- the threshold --------------------------------------------------------------------------
def test_a_threshold_below_what_liveness_guarantees_is_refused_naming_the_least(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loadmaster.settings_model import load_settings

    monkeypatch.setenv("LOADMASTER_AGENT_SILENT_AFTER", "5")
    with pytest.raises(ValidationError) as err:
        load_settings()
    assert err.value.field == "agent_silent_after"
    assert "at least 24" in err.value.detail and "agent_heard_every" in err.value.detail
    monkeypatch.setenv("LOADMASTER_AGENT_HEARD_EVERY", "1")
    assert load_settings().agent_silent_after == 5  # 2 x (1 s + a 1 s flush) = 4 s


# -- fences ---------------------------------------------------------------------------------
def test_a_fence_killed_at_its_timeout_takes_its_children_with_it(
    lm: Loadmaster, tmp_path: Path
) -> None:
    _fleet(lm, 3)
    pid_file = tmp_path / "child.pid"
    command = _recorder(tmp_path, f"sleep 300 &\necho $! > {pid_file}\nsleep 300")
    service = _service(lm, command, timeout_s=1.0)
    _heard_ago(lm, "h0", 3600)
    started = time.monotonic()
    with pytest.raises(FenceFailed) as err:
        service.evacuate("h0")
    assert time.monotonic() - started < 30
    assert "did not finish within 1 s (killed)" in err.value.detail
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the fence's child outlived the fence"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: only its parent (gone, so init) has yet to reap it.
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}").exists() else ""
    return bool(stat) and stat.split(")")[-1].split()[0] != "Z"


def test_a_fence_keeps_only_the_end_of_its_output(lm: Loadmaster, tmp_path: Path) -> None:
    """64 MB of output: the fence's error carries its last line, and this process held
    no more of it than the limit (the whole output was kept before)."""
    _fleet(lm, 3)
    spew = "yes xxxxxxxxxxxxxxx | head -c 67108864\necho 'power controller unreachable'\nexit 5"
    service = _service(lm, _recorder(tmp_path, spew))
    _heard_ago(lm, "h0", 3600)
    tracemalloc.start()
    try:
        with pytest.raises(FenceFailed) as err:
            service.evacuate("h0")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "exited 5: power controller unreachable" in err.value.detail
    assert peak < 8 * FENCE_OUTPUT_LIMIT + 4 * 1024 * 1024, f"{peak} bytes held"


def test_a_hung_fence_holds_up_no_other_hosts_evacuation(lm: Loadmaster, tmp_path: Path) -> None:
    """h0's fence hangs until its timeout (40 s); h1's succeeds at once: h1's VM is placed
    within seconds, while h0's fence still runs (one after the other, it waited 40 s)."""
    _fleet(lm, 6)
    vm = _running_on(lm, "h1", "web")
    command = _recorder(tmp_path, 'if [ "$1" = h0 ]; then sleep 120; fi')
    service = _service(lm, command, timeout_s=40.0)
    _heard_ago(lm, "h0", THRESHOLD_S + 3)
    _heard_ago(lm, "h1", THRESHOLD_S + 2)
    auto = AutoEvacuation(service, every_s=0.2, grace_s=0)
    auto.start()
    try:
        deadline = time.monotonic() + 25
        while lm.vms.get(vm).host == "h1" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lm.vms.get(vm).host not in (None, "h1"), "h1's VM waited for h0's fence"
        assert lm.hosts.get("h0").state == "up"  # its fence still runs
    finally:
        auto.stop()
    assert lm.hosts.get("h0").state == "up"  # killed at the stop: not known down


def test_a_failed_fence_is_reported_and_retried_with_backoff(
    lm: Loadmaster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _fleet(lm, 3)
    service = _service(lm, _recorder(tmp_path, "echo 'bmc said no' >&2; exit 1"), timeout_s=30)
    _heard_ago(lm, "h0", 3600)

    def claimed_ago(seconds: float) -> None:
        with lm.store.write() as session:
            session.execute(
                update(HostAgentRow).values(fence_claimed_at=now() - timedelta(seconds=seconds))
            )

    with caplog.at_level(logging.ERROR):
        assert service.run_pass() == []
    status = lm.host_agents.status("h0")
    assert (status.fence_failures, status.fence_error) == (1, status.fence_error)
    assert status.fence_error is not None and "exited 1: bmc said no" in status.fence_error
    assert "fencing host h0 failed" in caplog.text
    claimed_ago(61)  # one threshold plus the timeout after the first failure: again
    service.run_pass()
    assert _fenced(tmp_path) == ["h0", "h0"]
    assert lm.host_agents.status("h0").fence_failures == 2
    claimed_ago(61)  # after two failures in a row, twice that
    service.run_pass()
    assert _fenced(tmp_path) == ["h0", "h0"]
    claimed_ago(121)
    service.run_pass()
    assert _fenced(tmp_path) == ["h0", "h0", "h0"]
    good = _service(lm, _recorder(tmp_path), timeout_s=30)
    claimed_ago(241)
    good.run_pass()
    status = lm.host_agents.status("h0")
    assert (status.fence_failures, status.fence_error) == (0, None)
    assert lm.hosts.get("h0").state == "down"


# -- the operator ---------------------------------------------------------------------------
def test_confirm_down_with_force_evacuates_a_host_whose_agent_was_just_heard(
    lm: Loadmaster,
) -> None:
    _fleet(lm, 3)
    vm = _running_on(lm, "h0", "web")
    before = dump(lm)
    with pytest.raises(Conflict) as refused:
        lm.evacuation.evacuate("h0", confirm_down=True)
    assert "--confirm-down --force" in refused.value.detail
    with pytest.raises(ValidationError) as err:
        lm.evacuation.evacuate("h0", force=True)
    assert err.value.field == "force"
    assert dump(lm) == before
    result = lm.evacuation.evacuate("h0", confirm_down=True, force=True)
    assert result.known_down == "confirmed" and set(result.moved) == {vm}
    assert lm.hosts.get("h0").state == "down"


# -- migrations with a dead end -------------------------------------------------------------
def _migrating(lm: Loadmaster, name: str, source: str, target: str, **kw: object) -> str:
    vm = _running_on(lm, source, name, **kw)
    result = lm.scheduler.migrate(vm, host=target)
    assert result.placed == {vm: target}
    assert lm.vms.get(vm).state == "migrating"
    return vm


def test_an_ha_vm_migrating_off_a_host_that_dies_starts_on_its_destination(
    lm: Loadmaster,
) -> None:
    _fleet(lm, 3)
    vm = _migrating(lm, "db", "h0", "h1", tags=["ha"])
    _heard_ago(lm, "h0", 3600)
    result = lm.evacuation.evacuate("h0", confirm_down=True)
    assert result.taken_over == {vm: "landed"} and result.moved == {vm: "h1"}
    record = lm.vms.get(vm)
    assert (record.state, record.host, record.target_host) == ("pending", "h1", None)
    assert record.fault is not None and "host h0 is down" in record.fault
    work = lm.host_agents.work("h1")
    assert [(i.vm, i.action) for i in work.items] == [(vm, "launch")]
    assert lm.allocations.allocations(host="h0") == []
    assert audit(lm.store) == []
    lm.allocations.activate(vm, "h1")  # its agent launched it (or found it arrived)
    assert lm.vms.get(vm).state == "running" and audit(lm.store) == []


def test_a_migration_to_a_host_that_dies_is_aborted_and_the_vm_stays_on_its_source(
    lm: Loadmaster,
) -> None:
    _fleet(lm, 3)
    vm = _migrating(lm, "web", "h0", "h1")
    _heard_ago(lm, "h1", 3600)
    result = lm.evacuation.evacuate("h1", confirm_down=True)
    assert result.taken_over == {vm: "aborted"} and result.moved == {}
    record = lm.vms.get(vm)
    assert (record.state, record.host, record.target_host) == ("running", "h0", None)
    assert [(i.vm, i.action) for i in lm.host_agents.work("h0").items] == [(vm, "run")]
    assert lm.allocations.allocations(host="h1") == []
    assert audit(lm.store) == []


def test_a_migration_between_two_dead_hosts_is_evacuated_elsewhere(lm: Loadmaster) -> None:
    _fleet(lm, 4)
    vm = _migrating(lm, "web", "h0", "h1", tags=["ha"])
    for host in ("h0", "h1"):
        _heard_ago(lm, host, 3600)
    lm.evacuation.evacuate("h1", confirm_down=True)  # aborted: back on h0, which is up
    result = lm.evacuation.evacuate("h0", confirm_down=True)
    assert set(result.moved) == {vm} and result.moved[vm] in ("h2", "h3")
    assert lm.vms.get(vm).state == "pending" and audit(lm.store) == []


def test_ha_vms_of_hosts_dying_apart_get_the_room_before_others(
    lm: Loadmaster, tmp_path: Path
) -> None:
    """h0 (a plain VM) is past the threshold a few seconds before h1 (an ha VM); there is
    room for one of them. The plain VM waits while h1 is on its way to the threshold,
    so the ha VM gets the room once h1 is fenced (one pass at a time, the plain VM took
    it and the ha VM was stranded)."""
    _fleet(lm, 6)
    plain = _running_on(lm, "h0", "plain", "big")
    ha = _running_on(lm, "h1", "ha", "big", tags=["ha"])
    for host in ("h2", "h3", "h4"):
        _running_on(lm, host, f"filler-{host}", "big")
    _running_on(lm, "h5", "filler-h5", "small")  # room for one big VM, on h5
    service = _service(lm, _recorder(tmp_path))
    _heard_ago(lm, "h0", THRESHOLD_S + 1)
    _heard_ago(lm, "h1", THRESHOLD_S - 5)
    (first,) = service.run_pass()
    assert first.host == "h0" and first.moved == {} and first.deferred == (plain,)
    assert lm.vms.get(plain).host == "h0" and lm.hosts.get("h0").state == "down"
    _heard_ago(lm, "h1", THRESHOLD_S + 1)
    by_host = {r.host: r for r in service.run_pass()}
    assert by_host["h1"].moved == {ha: "h5"}
    assert [u.vm for u in by_host["h0"].unplaced] == [plain]
    fault = lm.vms.get(plain).fault
    assert fault is not None and fault.startswith("host h0 is down")
    assert "no other host fits it yet" in fault
    assert [(p.kind, p.subject) for p in audit(lm.store)] == [("on_down_host", plain)]
