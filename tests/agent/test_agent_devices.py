"""Host devices discovered from libvirt's node-device API (the test driver's fixture: 2 PFs
x 4 VFs with a NIC each, a GPU with two mediated-device types) and offered as nested
providers the way Nova's PCI-in-Placement does."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from loadmaster.agent.hypervisor.devices import (
    LibvirtDevices,
    device_providers,
    parse_device_config,
    parse_node_devices,
)
from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.manager import HostManager, ManagerConfig
from loadmaster.agent.manager.host_manager import discover
from loadmaster.errors import ValidationError

DEVICES_XML = Path(__file__).parent / "fixtures" / "devices.xml"
DEVICES_URI = f"test://{DEVICES_XML}"
# Nova's worked example: the first PF's VFs by vendor, product and address, with traits;
# the second PF's VFs under an operator's class; one mdev type.
SPEC: dict[str, Any] = {
    "pci": {
        "device_spec": [
            {
                "vendor_id": "8086",
                "product_id": "10ed",
                "address": "0000:3b:02.*",
                "traits": ["HW_NIC_SRIOV", "physnet1"],
            },
            {
                "vendor_id": "8086",
                "product_id": "10ed",
                "address": "0000:3b:03.*",
                "resource_class": "vf-physnet2",
            },
        ]
    },
    "devices": {"enabled_mdev_types": ["nvidia-222"]},
}


def fixture_devices() -> Any:
    return parse_node_devices(LibvirtDevices(DEVICES_URI).node_device_xmls())


def test_node_devices_are_read_with_their_kind_numa_and_interfaces() -> None:
    devices = {d.address: d for d in fixture_devices()}
    assert len(devices) == 11
    pf = devices["0000:3b:00.1"]
    assert (pf.kind, pf.vendor_id, pf.product_id, pf.ifname) == (
        "type-PF",
        "8086",
        "10fb",
        "enp59s0f1",
    )
    vf = devices["0000:3b:03.2"]
    assert (vf.kind, vf.parent_address, vf.numa_node) == ("type-VF", "0000:3b:00.1", 0)
    gpu = devices["0000:af:00.0"]
    assert (gpu.kind, gpu.numa_node, dict(gpu.mdev_types)) == (
        "type-PCI",
        1,
        {"nvidia-222": 16, "nvidia-223": 8},
    )


def test_two_pfs_of_vfs_and_a_gpu_become_nested_providers() -> None:
    config = ManagerConfig.from_dict(SPEC)
    found = device_providers("host1", fixture_devices(), config.devices)
    assert found.unmatched == ()
    got = {
        p.name: (p.resource_class, p.total, sorted(p.traits), p.numa_node) for p in found.providers
    }
    assert got == {
        "host1_0000:3B:00.0": (
            "CUSTOM_PCI_8086_10ED",
            4,
            [
                "COMPUTE_MANAGED_PCI_DEVICE",
                "CUSTOM_PCI_DEVICE_TYPE_VF",
                "CUSTOM_PHYSNET1",
                "HW_NIC_SRIOV",
            ],
            0,
        ),
        "host1_0000:3B:00.1": (
            "CUSTOM_VF_PHYSNET2",
            4,
            ["COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PCI_DEVICE_TYPE_VF"],
            0,
        ),
        "host1_pci_0000_af_00_0": ("VGPU", 16, [], 1),
    }
    by_name = {p.name: p for p in found.providers}
    assert by_name["host1_0000:3B:00.0"].devices == tuple(f"0000:3b:02.{i}" for i in range(4))
    assert by_name["host1_pci_0000_af_00_0"].mdev_type == "nvidia-222"
    body = discover(
        SimulatedHypervisor([], host_memory_kib=GIB).host_info(), config, "host1", found
    )
    assert body["children"]["host1_0000:3B:00.1"] == {
        "CUSTOM_VF_PHYSNET2": {"total": 4, "max_unit": 4, "allocation_ratio": 1.0}
    }
    assert body["child_traits"]["host1_pci_0000_af_00_0"] == []


def test_on_a_numa_host_devices_register_under_their_node() -> None:
    from loadmaster.agent.hypervisor.base import HostInfo, NumaCell

    info = HostInfo(
        "h", 16, 64 * GIB, 64 * GIB, (NumaCell(0, 8, 32 * GIB), NumaCell(1, 8, 32 * GIB))
    )
    config = ManagerConfig.from_dict(SPEC)
    body = discover(
        info, config, "host1", device_providers("host1", fixture_devices(), config.devices)
    )
    assert body["child_parents"] == {
        "host1_0000:3B:00.0": "host1_numa0",
        "host1_0000:3B:00.1": "host1_numa0",
        "host1_pci_0000_af_00_0": "host1_numa1",
    }
    assert set(body["children"]) == {"host1_numa0", "host1_numa1", *body["child_parents"]}


def test_a_whole_device_is_its_own_provider() -> None:
    """A PF matched (not its VFs) is one device of its own class."""
    config = parse_device_config(
        {"device_spec": [{"address": "0000:3b:00.*", "product_id": "10fb"}]}, {}
    )
    found = device_providers("h", fixture_devices(), config)
    assert [(p.name, p.resource_class, p.total, p.devices) for p in found.providers] == [
        ("h_0000:3B:00.0", "CUSTOM_PCI_8086_10FB", 1, ("0000:3b:00.0",)),
        ("h_0000:3B:00.1", "CUSTOM_PCI_8086_10FB", 1, ("0000:3b:00.1",)),
    ]
    # Each provider says what kind of device it gives, for an alias's device_type.
    assert all("CUSTOM_PCI_DEVICE_TYPE_PF" in p.traits for p in found.providers)
    config = parse_device_config({"device_spec": [{"address": "0000:af:00.0"}]}, {})
    [gpu] = device_providers("h", fixture_devices(), config).providers
    assert sorted(gpu.traits) == ["COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PCI_DEVICE_TYPE_PCI"]


def test_a_spec_matching_nothing_says_so(caplog: pytest.LogCaptureFixture) -> None:
    config = ManagerConfig.from_dict(
        {
            "pci": {"device_spec": [{"vendor_id": "15b3"}, {"product_id": "10ed"}]},
            "devices": {"enabled_mdev_types": ["nvidia-999"]},
        }
    )
    manager = HostManager(
        SimulatedHypervisor([], host_memory_kib=GIB),
        None,  # type: ignore[arg-type]
        config,
        host_name="h",
        hypervisor_uri="x",
        device_source=LibvirtDevices(DEVICES_URI),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="loadmaster.agent.manager"):
            found = manager.discover_devices()
    finally:
        manager.close()
    assert found.unmatched == ("pci.device_spec[0]", "devices.enabled_mdev_types nvidia-999")
    assert [p.total for p in found.providers] == [4, 4]
    assert "pci.device_spec[0] matches no device of host h" in caplog.text
    assert "nvidia-999 matches no device of host h" in caplog.text


def test_devices_offered_without_node_devices_is_an_error() -> None:
    manager = HostManager(
        SimulatedHypervisor([], host_memory_kib=GIB),
        None,  # type: ignore[arg-type]
        ManagerConfig.from_dict(SPEC),
        host_name="h",
        hypervisor_uri="x",
    )
    try:
        with pytest.raises(ValidationError) as err:
            manager.discover_devices()
    finally:
        manager.close()
    assert err.value.field == "pci.device_spec"


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"pci": {"device_spec": {"vendor_id": "8086"}}}, "pci.device_spec", "list of tables"),
        ({"pci": {"device_spec": ["8086"]}}, "pci.device_spec[0]", "must be a table"),
        (
            {"pci": {"device_spec": [{"vendor": "8086"}]}},
            "pci.device_spec[0].vendor",
            "not a device spec field",
        ),
        (
            {"pci": {"device_spec": [{"vendor_id": "intel"}]}},
            "pci.device_spec[0].vendor_id",
            "four hex digits",
        ),
        (
            {"pci": {"device_spec": [{"traits": ["X"]}]}},
            "pci.device_spec[0]",
            "matches every device",
        ),
        (
            {"pci": {"device_spec": [{"address": "*", "traits": 3}]}},
            "pci.device_spec[0].traits",
            "list of names",
        ),
        ({"pci": {"alias": []}}, "pci.alias", "not a setting"),
        ({"devices": {"enabled_mdev_types": [1]}}, "devices.enabled_mdev_types", "list of names"),
        ({"devices": {"mdev_class": ""}}, "devices.mdev_class", "non-empty"),
    ],
)
def test_a_bad_device_spec_is_refused_naming_the_field(
    data: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ValidationError) as err:
        ManagerConfig.from_dict(data)
    assert err.value.field == field
    assert words in str(err.value)


def test_a_pf_and_its_vfs_cannot_both_be_offered() -> None:
    config = parse_device_config(
        {"device_spec": [{"address": "0000:3b:00.0"}, {"address": "0000:3b:02.*"}]}, {}
    )
    with pytest.raises(ValidationError) as err:
        device_providers("h", fixture_devices(), config)
    assert err.value.field == "pci.device_spec[0]"
    assert "PF 0000:3b:00.0" in str(err.value)


def test_vfs_of_one_pf_share_class_and_traits() -> None:
    config = parse_device_config(
        {
            "device_spec": [
                {"address": "0000:3b:02.0", "resource_class": "a"},
                {"address": "0000:3b:02.*", "resource_class": "b"},
            ]
        },
        {},
    )
    with pytest.raises(ValidationError) as err:
        device_providers("h", fixture_devices(), config)
    assert err.value.field == "pci.device_spec[1]"
    assert "share" in str(err.value)


# -- devices given to guests --------------------------------------------------------------

VF = "CUSTOM_PCI_8086_10ED"
PF0, PF1, GPU = "h_0000:3B:00.0", "h_0000:3B:00.1", "h_pci_0000_af_00_0"
ATTACH = {
    "pci": {"device_spec": [{"product_id": "10ed"}]},
    "devices": {"enabled_mdev_types": ["nvidia-222"]},
}


class WorkApi:
    """The API as the manager sees it: a work list set by the test, outcomes noted."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.generation = 0
        self.up_vms: list[str] = []
        self.failed: dict[str, str] = {}
        self.said: dict[str, list[dict[str, Any]] | None] = {}

    def set(self, items: list[dict[str, Any]]) -> None:
        self.items, self.generation = items, self.generation + 1

    def register(self, host: str, body: dict[str, Any]) -> dict[str, Any]:
        return {}

    def work(self, host: str, after: int, wait: float) -> dict[str, Any]:
        return {"generation": self.generation, "items": self.items}

    def up(self, vm: str, host: str, devices: list[dict[str, Any]] | None = None) -> None:
        self.up_vms.append(vm)
        self.said[vm] = devices

    def launch_failed(self, vm: str, host: str, reason: str) -> None:
        self.failed[vm] = reason

    def migration_failed(self, vm: str, host: str, reason: str) -> None:
        self.failed[vm] = reason

    def report(self, host: str, payload: dict[str, Any]) -> None:
        return None


def launch(vm: int, providers: dict[str, dict[str, int]]) -> dict[str, Any]:
    return {
        "vm": f"5d6f3b2a-0000-4000-8000-{vm:012d}",
        "name": f"vm{vm}",
        "action": "launch",
        "memory_mb": 256,
        "vcpus": 1,
        "tags": [],
        "resources": {"VCPU": 1, **{c: n for a in providers.values() for c, n in a.items()}},
        "providers": providers,
    }


def hostdevs(hv: Any, vm: str) -> list[tuple[str | None, str]]:
    """(type, the PCI address or mdev uuid) of each hostdev of the guest's definition."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(hv._conn.lookupByUUIDString(vm).XMLDesc(0))
    out = []
    for dev in root.iterfind("./devices/hostdev"):
        source = dev.find("./source/address")
        assert source is not None
        if dev.get("type") == "pci":
            out.append(
                (
                    "pci",
                    f"{int(source.get('bus', ''), 16):02x}:{int(source.get('slot', ''), 16):02x}.{int(source.get('function', ''), 16)}",
                )
            )
        else:
            out.append((dev.get("type"), source.get("uuid", "")))
    return out


@pytest.fixture
def device_host() -> Any:
    from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor

    hv = LibvirtHypervisor(DEVICES_URI)
    # A test-driver host from a file has no NUMA cells to count free memory in: all of
    # its memory is free, or the host's final say would refuse every launch.
    assert hv.host_info().free_memory_kib == 64 * GIB
    yield hv
    hv.close()


def manager_on(hv: Any, api: WorkApi) -> HostManager:
    manager = HostManager(
        hv,
        api,  # type: ignore[arg-type]
        ManagerConfig.from_dict(ATTACH),
        host_name="h",
        hypervisor_uri=DEVICES_URI,
        device_source=LibvirtDevices(DEVICES_URI, conn=hv._conn),
    )
    manager.register()
    return manager


def test_each_guest_is_given_its_own_vf_and_a_stopped_one_frees_it(device_host: Any) -> None:
    api = WorkApi()
    manager = manager_on(device_host, api)
    try:
        items = [launch(i, {PF0 if i < 4 else PF1: {VF: 1}}) for i in range(8)]
        items.append(launch(8, {GPU: {"VGPU": 2}, "h_numa0": {"VCPU": 1}}))
        api.set(items)
        manager.step()
        manager.wait_idle()
        assert sorted(api.up_vms) == sorted(i["vm"] for i in items) and api.failed == {}
        given = {i["vm"]: hostdevs(device_host, i["vm"]) for i in items}
        vfs = [given[i["vm"]] for i in items[:8]]
        assert sorted(a for [(_, a)] in vfs) == sorted(
            [f"3b:02.{f}" for f in range(4)] + [f"3b:03.{f}" for f in range(4)]
        )
        assert all(a.startswith("3b:02") for [(_, a)] in vfs[:4])
        # Each up says what the VM was given.
        said = api.said[items[0]["vm"]]
        assert said == [{"provider": PF0, "address": f"0000:{vfs[0][0][1]}", "mdev_uuid": None}]
        gpu = given[items[8]["vm"]]
        assert [t for t, _ in gpu] == ["mdev", "mdev"] and gpu[0][1] != gpu[1][1]
        # PF0 is full: a claim the agent cannot honour is refused, naming the provider.
        api.set([*items, launch(9, {PF0: {VF: 1}})])
        manager.step()
        assert f"of {PF0} but only 0 of its devices are free" in api.failed[launch(9, {})["vm"]]
        # A claim on a device provider the agent does not offer is refused, not ignored.
        api.set([*items, launch(11, {"h_0000:3B:00.7": {VF: 1}})])
        manager.step()
        assert (
            "h_0000:3B:00.7, a provider whose devices this agent does not offer"
            in (api.failed[launch(11, {})["vm"]])
        )
        # vm0 stops (off the list): removed, its VF goes to the next VM asking PF0.
        freed = given[items[0]["vm"]][0][1]
        api.set([*items[1:], launch(10, {PF0: {VF: 1}})])
        report = manager.step()
        manager.wait_idle()
        assert report.removed == [items[0]["vm"]], (report, api.failed)
        assert hostdevs(device_host, launch(10, {})["vm"]) == [("pci", freed)]
    finally:
        manager.close()
    # A new agent reads back what the guests hold from their definitions.
    again = manager_on(device_host, api)
    try:
        assert again.assignments.held() == manager.assignments.held()
        assert len(again.assignments.held()) == 9
    finally:
        again.close()


def test_a_device_unplugged_is_registered_again_without_it() -> None:
    """The GPU leaves the host's node devices: a rescan registers the host anew without
    its provider (the server withdraws it); an unchanged rescan sends nothing."""
    sim = SimulatedHypervisor(
        [], host_memory_kib=GIB, node_devices=LibvirtDevices(DEVICES_URI).node_device_xmls()
    )
    bodies: list[dict[str, Any]] = []

    class Api(WorkApi):
        def register(self, host: str, body: dict[str, Any]) -> dict[str, Any]:
            bodies.append(body)
            return {}

    manager = HostManager(
        sim,
        Api(),
        ManagerConfig.from_dict(ATTACH),
        host_name="h",
        hypervisor_uri="x",
        device_source=sim,  # type: ignore[arg-type]
    )
    try:
        manager.register()
        assert GPU in bodies[0]["children"]
        assert manager.rescan_devices() is False and len(bodies) == 1
        sim.node_devices = [x for x in sim.node_devices if "pci_0000_af_00_0" not in x]
        assert manager.rescan_devices() is True
        assert GPU not in bodies[1]["children"] and PF0 in bodies[1]["children"]
    finally:
        manager.close()


def direct(item: dict[str, Any], mac: str) -> dict[str, Any]:
    """``item`` with one NIC that is a VF of the VM's (``lm:vnic_type=direct``)."""
    return {**item, "nics": [{"network": "physnet1", "mac": mac, "vnic_type": "direct"}]}


def test_a_nic_of_vnic_type_direct_is_its_own_vf_with_the_ledgers_mac(device_host: Any) -> None:
    import xml.etree.ElementTree as ET

    api = WorkApi()
    manager = manager_on(device_host, api)
    macs = ["52:54:00:aa:00:01", "52:54:00:aa:00:02"]
    items = [direct(launch(20 + i, {PF0: {VF: 1}}), mac) for i, mac in enumerate(macs)]
    # A direct NIC with no VF claimed (a GPU only) is refused, saying why.
    lacking = direct(launch(22, {GPU: {"VGPU": 1}}), "52:54:00:aa:00:03")
    try:
        api.set([*items, lacking])
        manager.step()
        manager.wait_idle()
        assert sorted(api.up_vms) == sorted(i["vm"] for i in items)
        assert "NIC(s) of vnic_type direct need a VF each" in api.failed[lacking["vm"]]
        seen = []
        for item, mac in zip(items, macs, strict=True):
            dom = ET.fromstring(device_host._conn.lookupByUUIDString(item["vm"]).XMLDesc(0))
            assert dom.findall("./devices/hostdev") == []
            [iface] = dom.findall("./devices/interface")
            assert (iface.get("type"), iface.get("managed")) == ("hostdev", "yes")
            assert iface.find("mac").get("address") == mac  # type: ignore[union-attr]
            source = iface.find("./source/address")
            assert source is not None and source.get("type") == "pci"
            address = f"{int(source.get('bus', ''), 16):02x}:{int(source.get('slot', ''), 16):02x}.{int(source.get('function', ''), 16)}"
            [said] = api.said[item["vm"]] or []
            assert said["address"] == f"0000:{address}" and said["provider"] == PF0
            seen.append(address)
        assert len(set(seen)) == 2 and all(a.startswith("3b:02.") for a in seen)
    finally:
        manager.close()
    # A new agent reads back which VF each NIC is, and its MAC.
    again = manager_on(device_host, api)
    try:
        held = again.assignments.held()
        assert sorted(d.mac for i in items for d in held[i["vm"]]) == macs
    finally:
        again.close()


def test_the_simulators_devices_are_two_pfs_of_vfs_and_a_gpu() -> None:
    from loadmaster.agent.hypervisor.simulated_devices import node_device_xmls

    devices = parse_node_devices(node_device_xmls())
    kinds = [(d.kind, d.numa_node) for d in devices]
    assert kinds.count(("type-PF", 0)) == 2 and kinds.count(("type-VF", 0)) == 8
    assert kinds[-1] == ("type-PCI", 1) and devices[-1].mdev_types["nvidia-222"] == 16
    assert all(d.ifname for d in devices if d.kind != "type-PCI")
    config = parse_device_config(
        {"device_spec": [{"product_id": "154c"}]}, {"enabled_mdev_types": ["nvidia-222"]}
    )
    found = device_providers("s", devices, config)
    assert [(p.resource_class, p.total) for p in found.providers] == [
        ("CUSTOM_PCI_8086_154C", 4),
        ("CUSTOM_PCI_8086_154C", 4),
        ("VGPU", 16),
    ]


def test_registration_counts_numa_cells_not_device_providers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = SimulatedHypervisor(
        [],
        host_memory_kib=GIB,
        numa_nodes=2,
        node_devices=LibvirtDevices(DEVICES_URI).node_device_xmls(),
    )
    manager = HostManager(
        sim,
        WorkApi(),  # type: ignore[arg-type]
        ManagerConfig.from_dict(ATTACH),
        host_name="h",
        hypervisor_uri="x",
        device_source=sim,  # type: ignore[arg-type]
    )
    try:
        with caplog.at_level(logging.INFO, logger="loadmaster.agent.manager"):
            manager.register()
        assert "VGPU=16 on 2 NUMA cells" in caplog.text, caplog.text
    finally:
        manager.close()
