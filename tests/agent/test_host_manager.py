"""The agent as the host's manager, end to end over HTTP: launches from pending claims,
the host's final say, migrations (and their rollback), stops, tags, and agents killed
mid-launch and mid-migration."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from manager_helpers import cloud

from loadmaster.agent.hypervisor.base import DiskSpec, GuestSpec, HypervisorError, NicSpec
from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor, domain_xml
from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.manager.host_manager import HostManager, ManagerConfig, discover
from loadmaster.errors import ValidationError

HOSTS = [f"h{i}" for i in range(8)]


def test_mass_start_with_slow_launches_loses_no_claim(db_url: str) -> None:
    """200 VMs through 8 agents, half of them launching slowly, with reports every 0.2 s
    racing the launches: every VM ends running exactly once, and none was ever given up."""
    with cloud(db_url, HOSTS) as c:
        for i, name in enumerate(HOSTS):
            c.add(name, launch_delay=0.4 if i % 2 else 0.0)
        uuids = c.create_vms(200)
        started = time.monotonic()
        for chunk in range(0, 200, 50):
            placed = c.schedule(uuids[chunk : chunk + 50])
            errors = [p["error"] for p in placed["placements"] if not p["host"]]
            assert errors == [], errors
        c.wait_for(lambda: c.states().get("running") == 200, 90, "200 VMs running")
        took = time.monotonic() - started
        print(f"mass start: 200 VMs from request to up in {took:.1f} s ({200 / took:.0f}/s)")
        c.assert_consistent()
        assert sorted(c.where_running()) == sorted(uuids)
        assert all(vm.fault is None for vm in c.lm.vms.list()), "a claim was given up"
        slow = {h for i, h in enumerate(HOSTS) if i % 2}
        assert any(vm.host in slow for vm in c.lm.vms.list())


def test_host_has_the_final_say(db_url: str) -> None:
    with cloud(db_url, ["tight", "roomy"]) as c:
        # The ledger sees 64 GiB on "tight", its agent keeps all but 0.5 GiB for the host.
        c.add("tight", config=ManagerConfig(memory_headroom_mb=64 * 1024 - 512))
        c.add("roomy", memory_gib=8)
        [vm] = c.create_vms(1)
        response = c.admin.put(f"/vms/{vm}/allocations", json={"host": "tight"})
        assert response.status_code == 200, response.text
        c.wait_for(lambda: c.lm.vms.get(vm).state == "running", 30, "the VM running")
        record = c.lm.vms.get(vm)
        assert record.host == "roomy"
        assert record.fault is not None and "real memory free" in record.fault
        assert c.where_running() == {vm: ["roomy"]}
        c.assert_consistent()


def test_failed_launch_is_placed_elsewhere(db_url: str) -> None:
    with cloud(db_url, ["a", "b"]) as c:
        c.add("a")
        c.add("b")
        [vm] = c.create_vms(1)
        c.sims["a"].failing_launches.add(vm)
        assert c.admin.put(f"/vms/{vm}/allocations", json={"host": "a"}).status_code == 200
        c.wait_for(lambda: c.lm.vms.get(vm).state == "running", 30, "the VM running")
        assert c.lm.vms.get(vm).host == "b"
        assert "simulated failure" in (c.lm.vms.get(vm).fault or "")


def test_migration_runs_and_a_failed_one_rolls_back(db_url: str) -> None:
    with cloud(db_url, ["src", "dst"]) as c:
        c.add("src")
        c.add("dst")
        first, second = c.create_vms(2)
        for vm in (first, second):
            assert c.admin.put(f"/vms/{vm}/allocations", json={"host": "src"}).status_code == 200
        c.wait_for(lambda: c.states().get("running") == 2, 30, "both running")
        moved = c.admin.post(f"/vms/{first}/migrate", json={"host": "dst"})
        assert moved.status_code == 200, moved.text
        c.wait_for(lambda: c.lm.vms.get(first).host == "dst", 30, "the migration")
        assert c.lm.vms.get(first).state == "running"
        assert c.where_running()[first] == ["dst"]
        assert c.lm.allocations.allocations(vm=first, host="src") == []

        c.sims["dst"].broken.add("receive_guest")
        failed = c.admin.post(f"/vms/{second}/migrate", json={"host": "dst"})
        assert failed.status_code == 200, failed.text
        c.wait_for(lambda: c.lm.vms.get(second).state == "running", 30, "the rollback")
        record = c.lm.vms.get(second)
        assert (record.host, record.target_host) == ("src", None)
        assert "migration to sim://dst failed" in (record.fault or "")
        assert c.where_running()[second] == ["src"]
        assert c.lm.allocations.allocations(vm=second, host="dst") == []
        c.assert_consistent()


def test_stop_and_delete_are_carried_out(db_url: str) -> None:
    with cloud(db_url, ["h"]) as c:
        c.add("h")
        stopped, deleted = c.create_vms(2)
        c.schedule([stopped, deleted])
        c.wait_for(lambda: len(c.where_running()) == 2, 30, "both running")
        assert c.admin.post(f"/vms/{stopped}/stop").status_code == 200
        assert c.admin.delete(f"/vms/{deleted}").status_code == 204
        c.wait_for(lambda: not c.where_running(), 30, "both guests gone")
        assert c.lm.vms.get(stopped).state == "stopped"
        c.assert_consistent()


def test_tags_changed_in_the_api_reach_the_guest_within_a_cycle(db_url: str) -> None:
    with cloud(db_url, ["h"]) as c:
        host = c.add("h", start=False)
        [vm] = c.create_vms(1, tags=["vapor"])
        c.schedule([vm])
        host.manager.step()
        host.manager.wait_idle()
        assert c.lm.vms.get(vm).state == "running"
        assert c.sims["h"].list_guests()[0].tags == frozenset({"vapor"})
        assert c.admin.put(f"/vms/{vm}/tags", json={"tags": ["gold"]}).status_code == 200
        step = host.manager.step()  # one pass of the manager, as one agent cycle
        assert step.retagged == [vm]
        assert c.sims["h"].list_guests()[0].tags == frozenset({"gold"})


def test_agent_killed_mid_launch_and_mid_migration_converges(db_url: str) -> None:
    with cloud(db_url, ["x", "y"]) as c:
        x = c.add("x", launch_delay=0.3)
        c.add("y")
        uuids = c.create_vms(12)
        for vm in uuids:
            assert c.admin.put(f"/vms/{vm}/allocations", json={"host": "x"}).status_code == 200
        c.wait_for(lambda: len(c.sims["x"].list_guests()) >= 3, 30, "some launches")
        x.kill()  # launches under way finish on the hypervisor, unannounced
        time.sleep(1.0)
        assert c.states().get("pending", 0) > 0, "nothing was left half done to converge"
        restarted = c.restart("x")
        c.wait_for(lambda: c.states().get("running") == 12, 60, "all 12 running")
        c.assert_consistent()

        # Mid-migration: the source's agent dies once the first guest has moved, with the
        # others unmoved or moved but not yet announced.
        moving = uuids[:6]
        for vm in moving:
            assert c.admin.post(f"/vms/{vm}/migrate", json={"host": "y"}).status_code == 200
        c.wait_for(
            lambda: any(g.uuid in moving for g in c.sims["y"].list_guests()), 30, "a first move"
        )
        restarted.kill()
        c.restart("x")
        c.wait_for(
            lambda: all(
                c.lm.vms.get(vm).host == "y" and c.lm.vms.get(vm).state == "running"
                for vm in moving
            ),
            60,
            "the moves completed",
        )
        c.assert_consistent()
        assert {vm: c.where_running()[vm] for vm in moving} == {vm: ["y"] for vm in moving}
        assert sum(len(v) for v in c.where_running().values()) == 12


@pytest.mark.parametrize("cells", [1, 2])
def test_discovery_from_the_hypervisor_and_the_config(cells: int) -> None:
    sim = SimulatedHypervisor([], host_memory_kib=16 * GIB, cpus=8, numa_nodes=cells)
    config = ManagerConfig(
        reserved={"MEMORY_MB": 1024},
        allocation_ratio={"VCPU": 4.0},
        resources={"CUSTOM_LICENSE_X": 4, "DISK_GB": 100},
    )
    body = discover(sim.host_info(), config, "n1")
    assert body["inventories"]["CUSTOM_LICENSE_X"]["total"] == 4
    if cells == 1:
        assert body["children"] == {}
        assert body["inventories"]["VCPU"] == {
            "total": 8,
            "reserved": 0,
            "allocation_ratio": 4.0,
        }
        assert body["inventories"]["MEMORY_MB"]["reserved"] == 1024
    else:
        assert "VCPU" not in body["inventories"]
        assert sorted(body["children"]) == ["n1_numa0", "n1_numa1"]
        assert body["children"]["n1_numa0"]["MEMORY_MB"]["reserved"] == 1024
        assert body["children"]["n1_numa1"]["MEMORY_MB"]["reserved"] == 0
        assert sum(c["VCPU"]["total"] for c in body["children"].values()) == 8


@pytest.mark.parametrize("cells", [1, 2])
def test_the_host_keeps_memory_for_itself_unless_configured(cells: int) -> None:
    """As Nova's reserved_host_memory_mb: 512 MiB by default, on the root or NUMA cell 0;
    the config's [reserved] MEMORY_MB sets it, 0 included."""
    sim = SimulatedHypervisor([], host_memory_kib=16 * GIB, cpus=8, numa_nodes=cells)

    def memory(config: ManagerConfig) -> dict[str, int]:
        body = discover(sim.host_info(), config, "n1")
        if cells == 1:
            return {"n1": body["inventories"]["MEMORY_MB"]["reserved"]}
        return {name: inv["MEMORY_MB"]["reserved"] for name, inv in body["children"].items()}

    default = {"n1": 512} if cells == 1 else {"n1_numa0": 512, "n1_numa1": 0}
    assert memory(ManagerConfig()) == default
    assert memory(ManagerConfig.from_dict({"reserved": {"VCPU": 1}})) == default
    none = memory(ManagerConfig.from_dict({"reserved": {"MEMORY_MB": 0}}))
    assert set(none.values()) == {0}


def test_config_file_errors_name_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[resources]\nCUSTOM_X = -1\n")
    with pytest.raises(ValidationError) as err:
        ManagerConfig.from_file(path)
    assert err.value.field == "resources.CUSTOM_X"
    path.write_text("[gpus]\nx = 1\n")
    with pytest.raises(ValidationError) as err:
        ManagerConfig.from_file(path)
    assert err.value.field == "gpus"


def test_a_pass_that_failed_half_way_is_not_taken_as_seen() -> None:
    """The hypervisor failed while the guests were listed: the next pass reads the same
    work list again at once, rather than long-polling for the next change (up to 20 s
    with the launches and moves of this one left undone)."""

    class Api:
        def __init__(self) -> None:
            self.after: list[int] = []

        def work(self, host: str, after: int, wait: float) -> dict[str, object]:
            self.after.append(after)
            return {"generation": 7, "items": []}

    class Flaky(SimulatedHypervisor):
        fail = True

        def list_guests(self):  # type: ignore[no-untyped-def]
            if self.fail:
                self.fail = False
                raise HypervisorError("a guest went away while listed")
            return super().list_guests()

    api = Api()
    manager = HostManager(
        Flaky([], host_memory_kib=GIB), api, ManagerConfig(), host_name="n", hypervisor_uri="x"
    )
    try:
        with pytest.raises(HypervisorError):
            manager.step()
        assert manager.acted_generation == -1
        manager.step()
        manager.step()
        assert api.after == [-1, -1, 7]
        assert manager.acted_generation == 7
    finally:
        manager.close()


def test_stopped_definitions_left_by_a_killed_agent_are_removed(node_hv: LibvirtHypervisor) -> None:
    """A launch killed between define and start, or a move killed between stopping the
    guest here and undefining it, leaves a stopped definition: once its VM is on no item
    of this host it goes; one still on the work list, or not launched by loadmaster, stays."""
    conn = node_hv._conn
    gone, kept = (
        GuestSpec(f"6f2c1d9e-3b7a-4c55-9a0e-00000000000{i}", f"left-{i}", GIB, 1) for i in (1, 2)
    )
    for spec in (gone, kept):
        conn.defineXML(domain_xml(spec, "TEST", None))
    foreign = conn.defineXML(
        '<domain type="test"><name>foreign</name><memory>1024</memory>'
        "<os><type>hvm</type></os></domain>"
    ).UUIDString()

    class Api:
        def work(self, host: str, after: int, wait: float) -> dict[str, object]:
            # ``kept`` is still migrating out (the destination has not said up).
            return {"generation": 3, "items": [{"vm": kept.uuid, "action": "migrate_out"}]}

    manager = HostManager(node_hv, Api(), ManagerConfig(), host_name="n", hypervisor_uri="x")  # type: ignore[arg-type]
    try:
        report = manager.step()
    finally:
        manager.close()
    assert report.removed == [gone.uuid]
    assert sorted(node_hv.stopped_guests()) == [kept.uuid]
    assert foreign in {d.UUIDString() for d in conn.listAllDomains(0)}


def test_a_guest_arriving_during_a_pass_is_not_removed(db_url: str) -> None:
    """The destination read its work list just before a migration was claimed and carried
    out, and lists its guests just after: the newcomer is on no item it read, yet it must
    stay (a later read has it)."""
    with cloud(db_url, ["src", "dst"]) as c:
        src = c.add("src", start=False)
        [vm] = c.create_vms(1)
        c.schedule([vm])  # before dst exists, so it lands on src
        src.manager.step()
        src.manager.wait_idle()
        assert c.lm.vms.get(vm).host == "src"
        dst = c.add("dst", start=False)
        read = dst.manager.api.work

        def stale_then_move(host: str, after: int, wait: float) -> dict[str, object]:
            answer = read(host, after, wait)
            if not getattr(stale_then_move, "moved", False):
                stale_then_move.moved = True  # type: ignore[attr-defined]
                c.lm.allocations.claim(vm, "dst")
                c.sims["src"].migrate_guest(vm, "sim://dst")
            return answer

        dst.manager.api.work = stale_then_move  # type: ignore[method-assign]
        step = dst.manager.step()
        assert step.removed == []
        assert c.where_running() == {vm: ["dst"]}
        dst.manager.step()  # the next pass sees migrate_in with the guest here: up
        assert c.lm.vms.get(vm).host == "dst" and c.lm.vms.get(vm).state == "running"


def test_a_host_matching_its_work_list_sends_no_report_and_one_that_differs_does(
    db_url: str,
) -> None:
    """The ledger would change nothing for a host that runs what its list says, so its
    agent says nothing: not when it starts empty, not after a launch it said ``up`` for.
    A guest gone behind the agent's back is a difference, reported, and the ledger ends
    the VM."""
    with cloud(db_url, ["h"]) as c:
        host = c.add("h", start=False)
        sent: list[dict[str, object]] = []
        send = host.manager.api.report

        def counted(name: str, payload: dict[str, object]) -> None:
            sent.append(payload)
            send(name, payload)

        host.manager.api.report = counted  # type: ignore[method-assign]
        host.manager.step()
        assert not host.manager.report()
        [vm] = c.create_vms(1)
        c.schedule([vm])
        host.manager.step()
        assert not host.manager.report() or sent[-1]["running_vms"] == [vm]
        host.manager.wait_idle()
        host.manager.step()  # the list after its up: the VM runs here
        assert c.lm.vms.get(vm).state == "running"
        before = len(sent)
        assert not host.manager.report()
        host.manager.step()
        assert not host.manager.report() and len(sent) == before
        host.sim.remove_guest(vm)  # gone, and no agent of loadmaster removed it
        host.manager.step()
        assert host.manager.report()
        assert sent[-1]["running_vms"] == [] and c.lm.vms.get(vm).state != "running"


@pytest.mark.parametrize(
    ("target_uri", "why"),
    [
        ("test:///default", "libvirt's test driver inside its agent's own process"),
        ("sim://here", "this host's own hypervisor URI sim://here"),
    ],
)
def test_a_destination_this_host_cannot_reach_is_refused_before_anything_moves(
    target_uri: str, why: str
) -> None:
    """The destination's URI is a test driver private to its agent's process, or this
    host's own URI: opened here, either reaches a hypervisor that is not the destination's
    (a cold move onto itself stopped the guest, and said it was up there). The migration
    is reported failed with the reason, and the guest keeps running here."""
    sim = SimulatedHypervisor([], host_memory_kib=4 * GIB)
    vm = "6f2c1d9e-3b7a-4c55-9a0e-0000000000aa"
    sim.launch_guest(GuestSpec(vm, "db-1", GIB, 1))
    failed: list[tuple[str, str, str]] = []

    class Api:
        def work(self, host: str, after: int, wait: float) -> dict[str, object]:
            item = {"vm": vm, "action": "migrate_out", "target_host": "there"}
            return {"generation": 2, "items": [{**item, "target_uri": target_uri}]}

        def migration_failed(self, vm: str, host: str, reason: str) -> None:
            failed.append((vm, host, reason))

    manager = HostManager(
        sim, Api(), ManagerConfig(), host_name="here", hypervisor_uri="sim://here"
    )  # type: ignore[arg-type]
    try:
        report = manager.step()
        manager.wait_idle()
    finally:
        manager.close()
    assert report.refused == [vm] and report.migrating == []
    [(said_vm, host, reason)] = failed
    assert (said_vm, host) == (vm, "here")
    assert reason.startswith("destination there cannot be reached: ") and why in reason
    assert [g.uuid for g in sim.list_guests()] == [vm]


def test_disk_and_nic_reach_the_guest_and_a_host_without_the_network_refuses(
    db_url: str,
) -> None:
    with cloud(db_url, ["nolan", "b", "c"]) as c:
        disk = ManagerConfig(resources={"DISK_GB": 100})
        for name in ("nolan", "b", "c"):
            c.add(name, config=disk)
        c.sims["nolan"].networks = frozenset({"default"})
        for name in ("b", "c"):
            c.sims[name].networks = frozenset({"lan"})
        assert c.admin.put("/images/tiny", json={"size_bytes": 1 << 20}).status_code == 201
        flavor = {"name": "disk", "resources": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 2}}
        assert c.admin.post("/flavors", json=flavor).status_code == 201
        [vm] = c.create_vms(1, "disk", image="tiny", network="lan")
        [nic] = c.lm.vms.get(vm).nics
        assert c.admin.put(f"/vms/{vm}/allocations", json={"host": "nolan"}).status_code == 200
        c.wait_for(lambda: c.lm.vms.get(vm).state == "running", 30, "the VM running")
        record = c.lm.vms.get(vm)
        assert record.host in ("b", "c")
        assert "network 'lan' is not defined on this host (defined: default)" in (
            record.fault or ""
        )
        host = c.sims[record.host]
        assert host.disks() == {vm: DiskSpec("tiny", 2 * 1024**3)}
        assert host.nics() == {vm: (NicSpec("lan", nic.mac),)}

        other = "c" if record.host == "b" else "b"
        assert c.admin.post(f"/vms/{vm}/migrate", json={"host": other}).status_code == 200
        c.wait_for(lambda: c.lm.vms.get(vm).host == other, 30, "the migration")
        assert c.sims[other].nics() == {vm: (NicSpec("lan", nic.mac),)}  # the same MAC
        assert c.lm.vms.get(vm).nics == (nic,)

        assert c.admin.delete(f"/vms/{vm}").status_code == 204
        c.wait_for(lambda: not c.where_running(), 30, "the guest gone")
        assert all(sim.disks() == {} for sim in c.sims.values())
        c.assert_consistent()


def test_a_host_back_while_down_removes_evacuated_guests_but_keeps_their_disks(
    db_url: str,
) -> None:
    """On a shared pool an evacuated VM runs on from its disk elsewhere: the agent of its
    dead host, back while the host is down, must not delete it with the guest. A VM
    deleted while its host is up loses its disk as before."""
    with cloud(db_url, ["h0", "h1"]) as c:
        h0 = c.add("h0", start=False)
        gone, moved = c.create_vms(2)
        c.schedule([gone, moved])
        h0.manager.step()
        h0.manager.wait_idle()
        h0.manager.step()
        kept: dict[str, bool] = {}
        remove = h0.sim.remove_guest

        def recorded(uuid: str, *, keep_disk: bool = False) -> None:
            kept[uuid] = keep_disk
            remove(uuid, keep_disk=keep_disk)

        h0.sim.remove_guest = recorded  # type: ignore[method-assign]
        c.lm.allocations.delete(gone)
        h0.manager.step()
        c.add("h1", start=False)
        c.lm.hosts.set_state("h0", "down")
        c.lm.allocations.claim(moved, "h1", intent="evacuate")
        h0.manager.step()
        assert kept == {gone: False, moved: True}
