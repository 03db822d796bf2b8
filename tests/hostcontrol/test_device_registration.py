"""Host devices registered by the agent as child providers with their traits: a device
gone is withdrawn and said, one in use is never dropped, bad traits change nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadmaster.agent.hypervisor.devices import LibvirtDevices, device_providers, parse_node_devices
from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.manager.host_manager import ManagerConfig, discover
from loadmaster.errors import NotFound, ValidationError
from loadmaster.pending import audit
from loadmaster.service import Loadmaster

DEVICES_URI = f"test://{Path(__file__).parents[1] / 'agent' / 'fixtures' / 'devices.xml'}"
CONFIG = ManagerConfig.from_dict(
    {
        "pci": {
            "device_spec": [
                {
                    "product_id": "10ed",
                    "address": "0000:3b:02.*",
                    "traits": ["physnet1", "HW_NIC_SRIOV"],
                },
                {"product_id": "10ed", "address": "0000:3b:03.*"},
            ]
        },
        "devices": {"enabled_mdev_types": ["nvidia-222"]},
    }
)
PF0, PF1, GPU = "h1_0000:3B:00.0", "h1_0000:3B:00.1", "h1_pci_0000_af_00_0"


def body(config: ManagerConfig = CONFIG) -> dict[str, Any]:
    devices = parse_node_devices(LibvirtDevices(DEVICES_URI).node_device_xmls())
    found = device_providers("h1", devices, config.devices)
    info = SimulatedHypervisor([], host_memory_kib=64 * GIB).host_info()
    return discover(info, config, "h1", found)


def register(lm: Loadmaster, fields: dict[str, Any]) -> Any:
    return lm.host_agents.register("h1", hypervisor_uri="test:///h1", **fields)


def test_devices_become_children_with_their_classes_and_traits(lm: Loadmaster) -> None:
    done = register(lm, body())
    assert done.refused == {} and done.withdrawn == ()
    pf0, pf1, gpu = (lm.hosts.get(n) for n in (PF0, PF1, GPU))
    assert {pf0.parent, pf1.parent, gpu.parent} == {done.host.uuid}
    assert pf0.inventories["CUSTOM_PCI_8086_10ED"].total == 4
    assert pf0.inventories["CUSTOM_PCI_8086_10ED"].max_unit == 4
    assert sorted(pf0.traits) == [
        "COMPUTE_MANAGED_PCI_DEVICE",
        "CUSTOM_PCI_DEVICE_TYPE_VF",
        "CUSTOM_PHYSNET1",
        "HW_NIC_SRIOV",
    ]
    assert sorted(pf1.traits) == ["COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PCI_DEVICE_TYPE_VF"]
    assert gpu.inventories["VGPU"].total == 16 and gpu.traits == ()
    assert lm.traits.exists("CUSTOM_PHYSNET1")
    # Registering the same again withdraws nothing and keeps the traits.
    again = register(lm, body())
    assert again.withdrawn == () and again.refused == {}
    assert lm.hosts.get(PF0).traits == pf0.traits


def test_a_device_gone_is_withdrawn_but_one_in_use_is_kept(lm: Loadmaster) -> None:
    before = register(lm, body()).host.inventories
    lm.flavors.create({"name": "vf", "resources": {"VCPU": 1, "CUSTOM_PCI_8086_10ED": 1}})
    vm = lm.vms.create("holder", "vf")
    lm.allocations.claim(vm.uuid, "h1")
    assert lm.hosts.usage(PF0)["CUSTOM_PCI_8086_10ED"].used == 1
    # The VFs and the GPU are no longer offered (the spec now matches nothing there).
    gone = register(
        lm, body(ManagerConfig.from_dict({"pci": {"device_spec": [{"vendor_id": "15b3"}]}}))
    )
    assert sorted(gone.withdrawn) == [PF0, PF1, GPU]
    assert list(gone.refused) == [f"{PF0}.CUSTOM_PCI_8086_10ED"]
    assert "below the 1 allocated" in gone.refused[f"{PF0}.CUSTOM_PCI_8086_10ED"]
    assert lm.hosts.get(PF0).inventories["CUSTOM_PCI_8086_10ED"].total == 4
    assert lm.hosts.get(PF1).inventories == {}
    assert lm.hosts.get(GPU).inventories == {}
    assert audit(lm.store) == []
    # The host's own inventory is untouched.
    assert lm.hosts.get("h1").inventories == before


@pytest.mark.parametrize(
    ("child_traits", "field", "words"),
    [
        (
            {"h1_other": ["CUSTOM_X"]},
            "child_traits.h1_other",
            "not among the registration's children",
        ),
        ({PF0: ["lower"]}, f"child_traits.{PF0}[0]", "not a trait name"),
        ({PF0: ["HW_NO_SUCH_TRAIT"]}, f"child_traits.{PF0}[0]", "not a custom trait"),
    ],
)
def test_bad_child_traits_change_nothing(
    lm: Loadmaster, child_traits: dict[str, list[str]], field: str, words: str
) -> None:
    fields = body()
    fields["child_traits"] = child_traits
    with pytest.raises(ValidationError) as err:
        register(lm, fields)
    assert err.value.field == field
    assert words in str(err.value)
    assert lm.hosts.list() == []
    with pytest.raises(NotFound):
        lm.hosts.get(PF0)


def test_a_launch_on_the_work_list_names_the_device_providers_claimed(lm: Loadmaster) -> None:
    register(lm, body())
    lm.flavors.create(
        {"name": "dev", "resources": {"VCPU": 1, "CUSTOM_PCI_8086_10ED": 1, "VGPU": 2}}
    )
    vm = lm.vms.create("holder", "dev").uuid
    lm.allocations.claim(vm, "h1")
    [item] = lm.host_agents.work("h1").items
    assert item.action == "launch"
    assert item.providers == {PF0: {"CUSTOM_PCI_8086_10ED": 1}, GPU: {"VGPU": 2}}
    assert item.to_dict()["providers"] == {PF0: {"CUSTOM_PCI_8086_10ED": 1}, GPU: {"VGPU": 2}}
    # Running, it still names them: a VM that arrived by migration is given its devices
    # by the destination's agent. A VM asking no device names none.
    lm.allocations.activate(vm)
    lm.flavors.create({"name": "plain", "resources": {"VCPU": 1, "MEMORY_MB": 64}})
    plain = lm.vms.create("plain", "plain").uuid
    lm.allocations.claim(plain, "h1")
    lm.allocations.activate(plain)
    items = {i.vm: i for i in lm.host_agents.work("h1").items}
    assert (items[vm].action, items[vm].providers) == (
        "run",
        {PF0: {"CUSTOM_PCI_8086_10ED": 1}, GPU: {"VGPU": 2}},
    )
    assert (items[plain].action, items[plain].providers) == ("run", {})


def test_a_device_whose_class_changes_keeps_what_is_in_use(lm: Loadmaster) -> None:
    register(lm, body())
    lm.flavors.create({"name": "vf", "resources": {"VCPU": 1, "CUSTOM_PCI_8086_10ED": 1}})
    vm = lm.vms.create("holder", "vf")
    lm.allocations.claim(vm.uuid, "h1")
    renamed = ManagerConfig.from_dict(
        {"pci": {"device_spec": [{"product_id": "10ed", "resource_class": "vf-any"}]}}
    )
    changed = register(lm, body(renamed))
    assert changed.refused == {
        f"{PF0}.CUSTOM_PCI_8086_10ED": "discovered capacity 0 is below the 1 allocated; "
        "the inventory is kept until VMs leave"
    }
    assert sorted(lm.hosts.get(PF0).inventories) == ["CUSTOM_PCI_8086_10ED", "CUSTOM_VF_ANY"]
    assert list(lm.hosts.get(PF1).inventories) == ["CUSTOM_VF_ANY"]
    assert audit(lm.store) == []
    # The operator sees both classes of PF0, and who holds the old one.
    shown = [
        (d.provider, d.resource_class, d.used, [h.name for h in d.holders])
        for d in lm.devices.of_host("h1")
    ]
    assert shown == [
        (PF0, "CUSTOM_PCI_8086_10ED", 1, ["holder"]),
        (PF0, "CUSTOM_VF_ANY", 0, []),
        (PF1, "CUSTOM_VF_ANY", 0, []),
    ]
