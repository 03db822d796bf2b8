"""A VM holding host devices migrates like any other: the scheduler claims its devices on
the destination's device providers, the source unplugs its devices before the move (a
guest holding VFIO devices cannot migrate), the destination's agent plugs in devices of
its own under the claimed provider, and the source's are free. A destination with no
free device is refused before anything moves; a drain moves such VMs the same way."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from manager_helpers import Cloud, cloud

from loadmaster.agent.hypervisor.devices import LibvirtDevices
from loadmaster.agent.manager import ManagerConfig
from loadmaster.demo.cloud import HostPlan

DEVICES_URI = f"test://{Path(__file__).parent / 'fixtures' / 'devices.xml'}"
VF = "CUSTOM_PCI_8086_10ED"
CONFIG = ManagerConfig.from_dict({"pci": {"device_spec": [{"product_id": "10ed"}]}})


def pfs(host: str) -> tuple[str, str]:
    return (f"{host}_0000:3B:00.0", f"{host}_0000:3B:00.1")


@contextmanager
def device_cloud(db_url: str, hosts: list[str]) -> Iterator[Cloud]:
    nodes = tuple(LibvirtDevices(DEVICES_URI).node_device_xmls())
    with cloud(db_url, hosts) as c:
        for host in hosts:
            c.add_host(HostPlan(host, config=CONFIG, node_devices=nodes))
        flavor = {"name": "vf", "resources": {"VCPU": 1, "MEMORY_MB": 512, VF: 1}}
        assert c.admin.post("/flavors", json=flavor).status_code == 201
        yield c


def devices_of(c: Cloud, vm: str) -> list[dict[str, Any]]:
    response = c.admin.get(f"/vms/{vm}/devices")
    assert response.status_code == 200, response.text
    devices: list[dict[str, Any]] = response.json()["devices"]
    return devices


def held_on(c: Cloud, host: str) -> dict[str, list[str]]:
    """What the host's simulated guests hold, by guest: the PCI addresses."""
    with c.sims[host]._lifecycle_lock:
        guests = dict(c.sims[host]._guests)
    return {u: [d.address for d in g.host_devices] for u, g in guests.items()}


def used_vfs(c: Cloud, host: str) -> int:
    return sum(c.lm.hosts.usage(pf)[VF].used for pf in pfs(host))


def start_on(c: Cloud, vms: list[str], host: str) -> None:
    for vm in vms:
        assert c.admin.put(f"/vms/{vm}/allocations", json={"host": host}).status_code == 200
    c.wait_for(
        lambda: all(c.lm.vms.get(vm).state == "running" for vm in vms), 60, "the VMs running"
    )
    c.wait_for(lambda: all(devices_of(c, vm) for vm in vms), 30, "their devices said")


def test_a_vm_with_a_vf_migrates_and_holds_a_vf_of_its_destination(db_url: str) -> None:
    with device_cloud(db_url, ["d1", "d2"]) as c:
        [vm] = c.create_vms(1, "vf")
        start_on(c, [vm], "d1")
        [before] = devices_of(c, vm)
        assert before["provider"] in pfs("d1")
        assert held_on(c, "d1") == {vm: [before["address"]]}
        moved = c.admin.post(f"/vms/{vm}/migrate", json={"host": "d2"})
        assert moved.status_code == 200, moved.text
        c.wait_for(lambda: c.lm.vms.get(vm).host == "d2", 30, "the migration")
        c.wait_for(lambda: bool(held_on(c, "d2").get(vm)), 30, "the VF plugged in on d2")
        c.wait_for(
            lambda: [d["provider"] in pfs("d2") for d in devices_of(c, vm)] == [True],
            30,
            "the destination's VF said",
        )
        [after] = devices_of(c, vm)
        assert after["provider"] in pfs("d2")
        assert held_on(c, "d2") == {vm: [after["address"]]}
        assert vm not in held_on(c, "d1")
        # The source's VF is free: on the ledger, and to the source's agent.
        assert (used_vfs(c, "d1"), used_vfs(c, "d2")) == (0, 1)
        c.wait_for(lambda: vm not in c.hosts["d1"].manager.assignments.held(), 30, "d1's VF freed")
        [other] = c.create_vms(1, "vf")
        start_on(c, [other], "d1")
        assert c.lm.vms.get(other).host == "d1"
        c.assert_consistent()


def test_a_destination_without_a_free_vf_is_refused_and_nothing_is_left(db_url: str) -> None:
    with device_cloud(db_url, ["d1", "d2"]) as c:
        full = c.create_vms(8, "vf")
        start_on(c, full, "d2")
        [vm] = c.create_vms(1, "vf")
        start_on(c, [vm], "d1")
        [before] = devices_of(c, vm)
        refused = c.admin.post(f"/vms/{vm}/migrate", json={"host": "d2"})
        assert refused.status_code == 409, refused.text
        assert f"short of {VF}" in refused.text, refused.text
        record = c.lm.vms.get(vm)
        assert (record.state, record.host, record.target_host) == ("running", "d1", None)
        assert c.lm.allocations.allocations(vm=vm, host="d2") == []
        assert devices_of(c, vm) == [before]
        assert held_on(c, "d1") == {vm: [before["address"]]}
        assert (used_vfs(c, "d1"), used_vfs(c, "d2")) == (1, 8)
        c.assert_consistent()


def test_a_drain_moves_vms_holding_vfs_each_to_a_vf_of_its_own(db_url: str) -> None:
    with device_cloud(db_url, ["d1", "d2"]) as c:
        vms = c.create_vms(3, "vf")
        start_on(c, vms, "d1")
        drained = c.admin.post("/hosts/d1/drain")
        assert drained.status_code == 200, drained.text
        c.wait_for(lambda: all(c.lm.vms.get(vm).host == "d2" for vm in vms), 60, "the VMs moved")
        c.wait_for(
            lambda: len(held_on(c, "d2")) == 3 and all(held_on(c, "d2").values()),
            30,
            "their VFs plugged in",
        )
        c.wait_for(
            lambda: all(
                [d["provider"] in pfs("d2") for d in devices_of(c, vm)] == [True] for vm in vms
            ),
            30,
            "the destination's VFs said",
        )
        addresses = [a for held in held_on(c, "d2").values() for a in held]
        assert len(set(addresses)) == 3
        assert held_on(c, "d1") == {}
        assert (used_vfs(c, "d1"), used_vfs(c, "d2")) == (0, 3)
        c.assert_consistent()


def test_a_failed_migration_keeps_the_vf_at_its_source_and_frees_the_destinations(
    db_url: str,
) -> None:
    with device_cloud(db_url, ["d1", "d2"]) as c:
        [vm] = c.create_vms(1, "vf")
        start_on(c, [vm], "d1")
        [before] = devices_of(c, vm)
        c.sims["d2"].broken.add("receive_guest")
        assert c.admin.post(f"/vms/{vm}/migrate", json={"host": "d2"}).status_code == 200
        c.wait_for(lambda: c.lm.vms.get(vm).target_host is None, 30, "the rollback")
        record = c.lm.vms.get(vm)
        assert (record.state, record.host) == ("running", "d1")
        assert "migration to sim://d2 failed" in (record.fault or "")
        # Plugged back in at the source, as it was; nothing of it left at the destination.
        c.wait_for(lambda: held_on(c, "d1") == {vm: [before["address"]]}, 30, "the VF back")
        assert devices_of(c, vm) == [before]
        assert c.lm.allocations.allocations(vm=vm, host="d2") == []
        assert (used_vfs(c, "d1"), used_vfs(c, "d2")) == (1, 0)
        c.wait_for(
            lambda: vm not in c.hosts["d2"].manager.assignments.held(), 30, "d2's VF set free"
        )
        assert held_on(c, "d2") == {}
        c.assert_consistent()


def simulated_manager(numa_nodes: int = 1) -> tuple[Any, Any, Any]:
    """A host manager on a simulated host with the fixture's devices, talking to a
    ``WorkApi`` the test fills."""
    from test_agent_devices import WorkApi

    from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
    from loadmaster.agent.manager import HostManager

    nodes = LibvirtDevices(DEVICES_URI).node_device_xmls()
    sim = SimulatedHypervisor(
        [], host_memory_kib=64 * GIB, node_devices=nodes, numa_nodes=numa_nodes
    )
    api = WorkApi()
    manager = HostManager(
        sim,
        api,  # type: ignore[arg-type]
        CONFIG,
        host_name="h",
        hypervisor_uri="x",
        device_source=sim,
    )
    return sim, api, manager


def test_a_destination_agent_short_of_devices_refuses_the_migration() -> None:
    """The ledger counts a provider's devices; were the agent's view shorter (a device
    gone unseen), the destination refuses before anything moves and keeps nothing."""
    from test_agent_devices import PF0, VF, launch

    from loadmaster.agent.hypervisor import GuestSpec

    sim, api, manager = simulated_manager()
    try:
        manager.register()
        items = [launch(i, {PF0: {VF: 1}}) for i in range(4)]
        api.set(items)
        manager.step()
        manager.wait_idle()
        assert len(api.up_vms) == 4 and api.failed == {}
        arriving = {**launch(4, {PF0: {VF: 1}}), "action": "migrate_in"}
        api.set([*items, arriving])
        report = manager.step()
        assert report.refused == [arriving["vm"]]
        assert f"host h: the claim holds 1 {VF} of {PF0} but only 0" in api.failed[arriving["vm"]]
        assert arriving["vm"] not in manager.assignments.held()
        # With a VF free, the same move sets one aside, and plugs it in on arrival.
        api.set([*items[1:], arriving])
        manager.step()
        manager.wait_idle()
        [reserved] = manager.assignments.held()[arriving["vm"]]
        # It arrives without devices, as the source's migration leaves it.
        sim.launch_guest(GuestSpec(arriving["vm"], "vm4", 256 * 1024, 1))
        api.set([*items[1:], {**arriving, "action": "run"}])
        manager.step()
        assert [d.address for d in sim._guests[arriving["vm"]].host_devices] == [reserved.address]
        assert api.said[arriving["vm"]] == [
            {"provider": PF0, "address": reserved.address, "mdev_uuid": None}
        ]
    finally:
        manager.close()


def test_libvirt_unplugs_and_plugs_in_by_the_devices_alias() -> None:
    """libvirt's side of a move: the devices the agent gave are unplugged by their alias
    and the destination's plugged in as elements of their own, live and in the
    definition. (The test driver has no hot-plug: its domain is wrapped to see the calls.)"""
    import libvirt

    from loadmaster.agent.hypervisor import GuestSpec
    from loadmaster.agent.hypervisor.devices import HostDevice
    from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor

    hv = LibvirtHypervisor(DEVICES_URI)
    try:
        vf = HostDevice("h_0000:3B:00.0", "0000:3b:02.1")
        gpu = HostDevice(
            "h_gpu", "0000:af:00.0", "nvidia-222", "4b20d080-1b54-4048-85b3-a6a62d165c01"
        )
        spec = GuestSpec("5d6f3b2a-0000-4000-8000-00000000000a", "held", 256 * 1024, 1)
        hv.launch_guest(replace(spec, host_devices=(vf, gpu)))
        real = hv._conn.lookupByUUIDString(spec.uuid)
        calls: list[tuple[str, str, int]] = []

        class Dom:
            def XMLDesc(self, flags: int) -> str:
                return str(real.XMLDesc(flags))

            def isPersistent(self) -> bool:
                return True

            def detachDeviceAlias(self, alias: str, flags: int) -> None:
                calls.append(("detach", alias, flags))

            def attachDeviceFlags(self, xml: str, flags: int) -> None:
                calls.append(("attach", xml, flags))

        hv._lookup = lambda uuid: Dom()  # type: ignore[method-assign]
        both = libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG
        hv.set_host_devices(spec.uuid, ())
        assert sorted(calls) == sorted([("detach", vf.alias, both), ("detach", gpu.alias, both)])
        calls.clear()
        other = HostDevice("h_0000:3B:00.0", "0000:3b:02.3")
        hv.set_host_devices(spec.uuid, (vf, gpu, other))
        [(kind, xml, flags)] = calls
        assert (kind, flags) == ("attach", both)
        assert 'bus="0x3b" slot="0x02" function="0x3"' in xml and other.alias in xml
    finally:
        hv.close()


def test_an_evacuated_vm_gets_a_vf_of_its_new_host(db_url: str) -> None:
    """Evacuation places the VM with the same request as a start: its devices are claimed
    on the new host, whose agent gives it one of its VFs; the dead host's is free."""
    with device_cloud(db_url, ["d1", "d2"]) as c:
        [vm] = c.create_vms(1, "vf")
        start_on(c, [vm], "d1")
        c.hosts["d1"].kill()
        done = c.admin.post("/hosts/d1/evacuate", json={"confirm_down": True, "force": True})
        assert done.status_code == 200, done.text
        c.wait_for(lambda: c.lm.vms.get(vm).host == "d2", 30, "the VM placed on d2")
        c.wait_for(lambda: c.lm.vms.get(vm).state == "running", 30, "the VM running on d2")
        c.wait_for(
            lambda: [d["provider"] in pfs("d2") for d in devices_of(c, vm)] == [True],
            30,
            "its d2 VF said",
        )
        assert held_on(c, "d2") == {vm: [devices_of(c, vm)[0]["address"]]}
        assert (used_vfs(c, "d1"), used_vfs(c, "d2")) == (0, 1)


def test_a_running_vm_whose_claim_holds_no_device_here_is_not_said_up_again() -> None:
    """A run item naming only a NUMA node of the host (a custom class at the root made
    the server name its providers) gives nothing to plug in: no up at every pass."""
    from test_agent_devices import launch

    from loadmaster.agent.hypervisor import GuestSpec

    sim, api, manager = simulated_manager(numa_nodes=2)
    try:
        manager.register()
        item = {**launch(30, {"h_numa0": {"VCPU": 1}}), "action": "run"}
        sim.launch_guest(GuestSpec(item["vm"], "vm30", 256 * 1024, 1))
        api.set([item])
        for _ in range(3):
            manager.step()
        assert api.up_vms == [] and api.failed == {}
    finally:
        manager.close()
