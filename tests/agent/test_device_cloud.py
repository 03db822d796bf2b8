"""Host devices end to end over HTTP: a simulated host with the fixture's 2 PFs x 4 VFs
registers them, 8 VMs asking a VF each run with a VF of their own, a 9th finds no host,
a stopped VM's VF goes to the next, and the operator sees who holds what."""

from __future__ import annotations

from pathlib import Path

from manager_helpers import cloud
from typer.testing import CliRunner

from loadmaster.agent.hypervisor.devices import LibvirtDevices
from loadmaster.agent.manager.host_manager import ManagerConfig
from loadmaster.cli.app import app
from loadmaster.demo.cloud import ADMIN_TOKEN, HostPlan

DEVICES_URI = f"test://{Path(__file__).parent / 'fixtures' / 'devices.xml'}"
VF = "CUSTOM_PCI_8086_10ED"
PFS = ("d1_0000:3B:00.0", "d1_0000:3B:00.1")


def test_vfs_are_claimed_given_shown_and_freed(db_url: str) -> None:
    with cloud(db_url, ["d1"]) as c:
        config = ManagerConfig.from_dict({"pci": {"device_spec": [{"product_id": "10ed"}]}})
        nodes = tuple(LibvirtDevices(DEVICES_URI).node_device_xmls())
        c.add_host(HostPlan("d1", config=config, node_devices=nodes))
        flavor = {"name": "vf", "resources": {"VCPU": 1, "MEMORY_MB": 512, VF: 1}}
        assert c.admin.post("/flavors", json=flavor).status_code == 201
        uuids = c.create_vms(9, "vf")
        placed = c.schedule(uuids)["placements"]
        assert [p["host"] for p in placed[:8]] == ["d1"] * 8
        assert placed[8]["host"] is None and f"short of {VF}" in placed[8]["error"]["detail"]
        c.wait_for(lambda: c.states().get("running") == 8, 60, "8 VMs running")

        def devices_of(vm: str) -> list[dict[str, object]]:
            response = c.admin.get(f"/vms/{vm}/devices")
            assert response.status_code == 200, response.text
            devices: list[dict[str, object]] = response.json()["devices"]
            return devices

        given = {vm: devices_of(vm) for vm in uuids[:8]}
        addresses = [d["address"] for devices in given.values() for d in devices]
        assert len(addresses) == 8 and len(set(addresses)) == 8
        assert all(
            len(devices) == 1 and devices[0]["provider"] in PFS for devices in given.values()
        )
        host = c.admin.get("/hosts/d1/devices").json()["devices"]
        assert [(d["provider"], d["resource_class"], d["used"], d["total"]) for d in host] == [
            (PFS[0], VF, 4, 4),
            (PFS[1], VF, 4, 4),
        ]
        assert "COMPUTE_MANAGED_PCI_DEVICE" in host[0]["traits"]
        holders = {h["vm"]: h["devices"] for d in host for h in d["holders"]}
        assert holders == given
        # The operator's view: host show and vm show list the devices and who holds them.
        env = {"LOADMASTER_URL": c.url, "LOADMASTER_TOKEN": ADMIN_TOKEN}
        shown = CliRunner().invoke(app, ["host", "show", "d1"], env=env)
        assert shown.exit_code == 0, shown.output
        first = c.lm.vms.get(uuids[0])
        assert PFS[0] in shown.output and "COMPUTE_MANAGED_PCI_DEVICE" in shown.output
        assert f"{first.name} ({given[uuids[0]][0]['address']})" in shown.output
        shown = CliRunner().invoke(app, ["vm", "show", uuids[0]], env=env)
        assert shown.exit_code == 0, shown.output
        assert "Host devices" in shown.output
        assert str(given[uuids[0]][0]["address"]) in shown.output
        # A stopped VM frees its VF; the ninth gets it.
        freed = given[uuids[0]][0]["address"]
        assert c.admin.post(f"/vms/{uuids[0]}/stop").status_code == 200
        c.wait_for(lambda: uuids[0] not in c.where_running(), 30, "the VM removed")
        assert devices_of(uuids[0]) == []
        assert c.schedule([uuids[8]])["placements"][0]["host"] == "d1"
        c.wait_for(lambda: c.lm.vms.get(uuids[8]).state == "running", 30, "the ninth running")
        assert [d["address"] for d in devices_of(uuids[8])] == [freed]
        c.assert_consistent()


def test_a_direct_nic_is_a_vf_with_the_vms_mac_and_follows_it_when_it_moves(db_url: str) -> None:
    """Over HTTP: a flavor of lm:vnic_type=direct gives its VM's NIC as one of the host's
    VFs with the MAC the ledger keeps, on its first host and on the one it migrates to."""
    import json
    import xml.etree.ElementTree as ET

    from manager_helpers import Cloud

    import loadmaster
    from loadmaster.settings_model import Settings

    aliases = json.dumps([{"name": "vf", "resource_class": VF, "device_type": "type-VF"}])
    lm = loadmaster.open(db_url, settings=Settings(pci_aliases=aliases))
    c = Cloud(lm, sla=False, agent_hosts=["d1", "d2"])
    try:
        config = ManagerConfig.from_dict({"pci": {"device_spec": [{"product_id": "10ed"}]}})
        nodes = tuple(LibvirtDevices(DEVICES_URI).node_device_xmls())
        for host in ("d1", "d2"):
            c.add_host(HostPlan(host, config=config, node_devices=nodes))
        flavor = {
            "name": "nfv",
            "resources": {"VCPU": 1, "MEMORY_MB": 512},
            "extra_specs": {"pci_passthrough:alias": "vf:1", "lm:vnic_type": "direct"},
        }
        assert c.admin.post("/flavors", json=flavor).status_code == 201, flavor
        [vm] = c.create_vms(1, "nfv")
        mac = c.lm.vms.get(vm).nics[0].mac

        def nic_on(host: str) -> list[tuple[str | None, str | None]]:
            """(type, MAC) of each interface and hostdev of the guest on ``host``."""
            dom = ET.fromstring(c.sims[host].guest_xmls().get(vm, "<domain/>"))
            return [
                (d.get("type"), d.find("mac").get("address") if d.find("mac") is not None else None)  # type: ignore[union-attr]
                for d in dom.iterfind("./devices/*")
            ]

        assert c.admin.put(f"/vms/{vm}/allocations", json={"host": "d1"}).status_code == 200
        c.wait_for(lambda: c.lm.vms.get(vm).state == "running", 30, "the VM running")
        c.wait_for(lambda: nic_on("d1") == [("hostdev", mac)], 30, "its VF NIC on d1")
        assert c.admin.post(f"/vms/{vm}/migrate", json={"host": "d2"}).status_code == 200
        c.wait_for(lambda: c.lm.vms.get(vm).host == "d2", 30, "the migration")
        c.wait_for(lambda: nic_on("d2") == [("hostdev", mac)], 30, "its VF NIC on d2")
        [device] = c.admin.get(f"/vms/{vm}/devices").json()["devices"]
        assert device["provider"].startswith("d2_")
    finally:
        c.close()
        lm.close()
