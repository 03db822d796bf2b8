"""Flavors ask for host devices by PCI alias (or ``resources:VGPU``); the scheduler and the
ledger claim them on the host's device providers like any nested resource, pending
counted, and two schedulers racing never put more VMs on a PF than it has VFs."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import loadmaster
from loadmaster.agent.hypervisor.devices import LibvirtDevices, device_providers, parse_node_devices
from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.manager.host_manager import ManagerConfig, discover
from loadmaster.errors import InsufficientCapacity, NotFound, ValidationError
from loadmaster.pending import audit
from loadmaster.scheduler import RequestSpec
from loadmaster.scheduler.core.results import NoHostFits
from loadmaster.service import Loadmaster
from loadmaster.settings_model import Settings

DEVICES_URI = f"test://{Path(__file__).parents[1] / 'agent' / 'fixtures' / 'devices.xml'}"
VF = "CUSTOM_PCI_8086_10ED"
PFS = ("h1_0000:3B:00.0", "h1_0000:3B:00.1")
ALIASES = json.dumps(
    [
        {"name": "vf", "vendor_id": "8086", "product_id": "10ed"},
        {"name": "vf-physnet1", "resource_class": VF, "traits": ["CUSTOM_PHYSNET1"]},
        {"name": "nic", "resource_class": "CUSTOM_NO_HOST_HAS_IT"},
    ]
)


def register_devices(lm: Loadmaster) -> None:
    config = ManagerConfig.from_dict(
        {
            "pci": {"device_spec": [{"product_id": "10ed", "traits": ["physnet1"]}]},
            "devices": {"enabled_mdev_types": ["nvidia-222"]},
        }
    )
    found = device_providers(
        "h1", parse_node_devices(LibvirtDevices(DEVICES_URI).node_device_xmls()), config.devices
    )
    info = SimulatedHypervisor([], host_memory_kib=64 * GIB).host_info()
    lm.host_agents.register(
        "h1", hypervisor_uri="test:///h1", **discover(info, config, "h1", found)
    )


@pytest.fixture
def dlm(db_url: str) -> Any:
    service = loadmaster.open(db_url, settings=Settings(pci_aliases=ALIASES))
    try:
        register_devices(service)
        service.flavors.create(
            {
                "name": "vf",
                "resources": {"VCPU": 1, "MEMORY_MB": 512},
                "extra_specs": {"pci_passthrough:alias": "vf:1"},
            }
        )
        yield service
    finally:
        service.close()


def alias_flavor(
    alias: str, name: str = "x", specs: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A flavor of one VCPU asking ``alias`` (``pci_passthrough:alias``) and ``specs``."""
    extra = {"pci_passthrough:alias": alias, **(specs or {})}
    return {"name": name, "resources": {"VCPU": 1}, "extra_specs": extra}


def vms(lm: Loadmaster, n: int, flavor: str = "vf") -> list[str]:
    return [lm.vms.create(f"{flavor}-{i}", flavor).uuid for i in range(n)]


def used_vfs(lm: Loadmaster) -> list[int]:
    return [lm.hosts.usage(pf)[VF].used for pf in PFS]


def test_an_alias_becomes_its_class_and_traits(dlm: Loadmaster) -> None:
    assert dlm.flavors.get("vf").resources == {"VCPU": 1, "MEMORY_MB": 512, VF: 1}
    made = dlm.flavors.create(alias_flavor("vf-physnet1:2", "two"))
    assert made.resources == {"VCPU": 1, VF: 2}
    assert made.required_traits == ("CUSTOM_PHYSNET1",)


def test_eight_vfs_fill_and_a_ninth_vm_finds_no_host_until_one_stops(dlm: Loadmaster) -> None:
    uuids = vms(dlm, 9)
    placed = [dlm.scheduler.schedule([RequestSpec(vms=[u])]).placements[0] for u in uuids]
    assert [p.host for p in placed[:8]] == ["h1"] * 8
    assert used_vfs(dlm) == [4, 4]
    ninth = placed[8]
    assert ninth.host is None and isinstance(ninth.error, NoHostFits)
    assert str(ninth.error).endswith(f"no host fits: 1 hosts; 1 short of {VF}"), str(ninth.error)
    assert dlm.vms.get(uuids[8]).state == "requested"
    # A stopped VM's VF is free again, for the ninth.
    dlm.allocations.stop(uuids[0])
    assert sum(used_vfs(dlm)) == 7
    again = dlm.scheduler.schedule([RequestSpec(vms=[uuids[8]])]).placements[0]
    assert again.host == "h1", again.error
    assert used_vfs(dlm) == [4, 4]
    assert audit(dlm.store) == []


def test_a_vgpu_is_asked_as_a_class(dlm: Loadmaster) -> None:
    dlm.flavors.create(
        {"name": "gpu", "resources": {"VCPU": 1}, "extra_specs": {"resources:VGPU": "1"}}
    )
    [vm] = vms(dlm, 1, "gpu")
    assert dlm.scheduler.schedule([RequestSpec(vms=[vm])]).placements[0].host == "h1"
    assert dlm.hosts.usage("h1_pci_0000_af_00_0")["VGPU"].used == 1


def test_two_schedulers_racing_never_overfill_a_pf(dlm: Loadmaster, db_url: str) -> None:
    """12 VMs, 6 each to two schedulers of their own (two services on one database), one
    VM a call, at once: exactly 8 land, 4 on each PF, and the rest find no host."""
    other = loadmaster.open(db_url, settings=Settings(pci_aliases=ALIASES))
    uuids = vms(dlm, 12)
    outcomes: dict[str, str | None] = {}
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def run(lm: Loadmaster, mine: list[str]) -> None:
        try:
            start.wait(timeout=30)
            for vm in mine:
                outcomes[vm] = lm.scheduler.schedule([RequestSpec(vms=[vm])]).placements[0].host
        except BaseException as exc:  # reported below, not lost in the thread
            failures.append(exc)

    threads = [
        threading.Thread(target=run, args=(lm, uuids[i::2])) for i, lm in enumerate((dlm, other))
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        other.close()
    assert not failures, failures
    assert sorted(outcomes) == sorted(uuids)
    assert sum(1 for h in outcomes.values() if h == "h1") == 8
    assert used_vfs(dlm) == [4, 4]
    assert audit(dlm.store) == []


def test_an_alias_nobody_defines_is_refused_naming_it(dlm: Loadmaster) -> None:
    before = [f.name for f in dlm.flavors.list()]
    with pytest.raises(ValidationError) as err:
        dlm.flavors.create(alias_flavor("gpu:1"))
    assert err.value.field == "extra_specs.pci_passthrough:alias"
    assert "no PCI alias gpu" in str(err.value)
    for bad in ("vf:0", "vf:two", ":1"):
        with pytest.raises(ValidationError):
            dlm.flavors.create(alias_flavor(bad))
    assert [f.name for f in dlm.flavors.list()] == before


def test_a_device_class_nobody_offers_is_refused_naming_it(dlm: Loadmaster) -> None:
    before = [f.name for f in dlm.flavors.list()]
    with pytest.raises(NotFound) as err:
        dlm.flavors.create(alias_flavor("nic"))
    assert err.value.field == "extra_specs.pci_passthrough:alias"
    assert "alias nic asks for CUSTOM_NO_HOST_HAS_IT" in str(err.value)
    with pytest.raises(NotFound) as err:
        dlm.flavors.create(
            {"name": "x", "resources": {"VCPU": 1}, "extra_specs": {"resources:CUSTOM_NOPE": "1"}}
        )
    assert err.value.field == "extra_specs.resources:CUSTOM_NOPE"
    assert [f.name for f in dlm.flavors.list()] == before
    # Nothing was claimed on the host's devices.
    assert used_vfs(dlm) == [0, 0]


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ("{", "pci_aliases", "not JSON"),
        ('{"name": "a"}', "pci_aliases", "JSON list"),
        ('["a"]', "pci_aliases[0]", "must be an object"),
        ('[{"name": "a", "vendor": "8086"}]', "pci_aliases[0].vendor", "not an alias field"),
        ('[{"name": "a", "vendor_id": "8086"}]', "pci_aliases[0].product_id", "four hex digits"),
        ('[{"name": "a b", "resource_class": "VGPU"}]', "pci_aliases[0].name", "letters"),
        ('[{"name": "a", "resource_class": "gpu"}]', "pci_aliases[0].resource_class", "custom"),
    ],
)
def test_a_bad_alias_setting_is_refused_naming_the_entry(
    value: str, field: str, words: str
) -> None:
    from loadmaster.resources.aliases import parse_aliases

    with pytest.raises(ValidationError) as err:
        parse_aliases(value)
    assert err.value.field == field
    assert words in str(err.value)


# -- hw:pci_numa_affinity_policy, judged in the same search -----------------------------

NODE = {"VCPU": {"total": 4}, "MEMORY_MB": {"total": 4096}}


@pytest.fixture
def numa_host(lm: Loadmaster) -> Loadmaster:
    """Host n: two NUMA nodes of 4 VCPU; a PF of 4 VFs on node 1 (under its provider)
    and, with no NUMA information, a GPU under the host itself."""
    lm.host_agents.register(
        "n",
        hypervisor_uri="test:///n",
        inventories={},
        children={
            "n_numa0": NODE,
            "n_numa1": NODE,
            "n_0000:3B:00.0": {VF: {"total": 4, "max_unit": 4}},
            "n_gpu": {"VGPU": {"total": 4}},
        },
        child_parents={"n_0000:3B:00.0": "n_numa1"},
    )
    for policy in ("required", "legacy", "preferred"):
        for asked in ((VF, "1"), ("VGPU", "1")):
            lm.flavors.create(
                {
                    "name": f"{policy}-{asked[0]}",
                    "resources": {"VCPU": 4, "MEMORY_MB": 1024},
                    "extra_specs": {
                        f"resources:{asked[0]}": asked[1],
                        "hw:pci_numa_affinity_policy": policy,
                    },
                }
            )
    lm.flavors.create(
        {"name": "filler", "resources": {"VCPU": 4}, "extra_specs": {"hw:numa_nodes": "1"}}
    )
    return lm


def place(lm: Loadmaster, flavor: str) -> tuple[str, Any]:
    vm = lm.vms.create(f"{flavor}-vm", flavor).uuid
    return vm, lm.scheduler.schedule([RequestSpec(vms=[vm])]).placements[0]


def on_node(lm: Loadmaster, vm: str) -> list[str]:
    return sorted(
        p for p, amounts in lm.allocations.pending_for_vm(vm).items() if "VCPU" in amounts
    )


def test_required_finds_the_node_of_the_free_devices_in_the_same_search(
    numa_host: Loadmaster,
) -> None:
    """Node 0 comes first and has room, but not the VF: the search goes on to node 1."""
    vm, placed = place(numa_host, f"required-{VF}")
    assert placed.host == "n", placed.error
    assert on_node(numa_host, vm) == ["n_numa1"]


def test_required_refuses_a_host_whose_devices_are_on_another_node_preferred_takes_it(
    numa_host: Loadmaster,
) -> None:
    first, _ = place(numa_host, "filler")  # node 0 first ...
    second, _ = place(numa_host, "filler")  # ... then node 1, the VF's node
    assert (on_node(numa_host, first), on_node(numa_host, second)) == (["n_numa0"], ["n_numa1"])
    numa_host.allocations.stop(first)  # room on node 0 only; the free VFs are on node 1
    for policy in ("required", "legacy"):
        vm, placed = place(numa_host, f"{policy}-{VF}")
        assert placed.host is None and isinstance(placed.error, NoHostFits)
        assert f"no NUMA node with room and its devices ({policy})" in str(placed.error)
        with pytest.raises(InsufficientCapacity) as err:
            numa_host.allocations.claim(vm, "n")
        assert f"hw:pci_numa_affinity_policy={policy}" in str(err.value)
        assert f"{VF}: none with room on NUMA node n_numa0 ({policy})" in str(err.value)
    vm, placed = place(numa_host, f"preferred-{VF}")
    assert placed.host == "n", placed.error
    assert on_node(numa_host, vm) == ["n_numa0"]
    assert numa_host.allocations.pending_for_vm(vm)["n_0000:3B:00.0"] == {VF: 1}
    assert audit(numa_host.store) == []


def test_legacy_takes_a_device_with_no_numa_information_required_does_not(
    numa_host: Loadmaster,
) -> None:
    _, required = place(numa_host, "required-VGPU")
    assert required.host is None
    assert "no NUMA node with room and its devices (required)" in str(required.error)
    for policy in ("legacy", "preferred"):
        vm, placed = place(numa_host, f"{policy}-VGPU")
        assert placed.host == "n", (policy, placed.error)
        assert numa_host.allocations.pending_for_vm(vm)["n_gpu"] == {"VGPU": 1}


def test_a_socket_policy_is_refused_naming_it(numa_host: Loadmaster) -> None:
    with pytest.raises(ValidationError) as err:
        numa_host.flavors.create(
            {
                "name": "sock",
                "resources": {"VCPU": 1},
                "extra_specs": {"hw:pci_numa_affinity_policy": "socket"},
            }
        )
    assert err.value.field == "extra_specs.hw:pci_numa_affinity_policy"
    assert "sockets are not modelled" in str(err.value)


def test_devices_are_not_numa_nodes_for_one_node_flavors(numa_host: Loadmaster) -> None:
    """hw:numa_nodes=1 puts CPUs and memory on one node; the devices (children too) are
    no nodes, so a VF and a vGPU come along wherever they are."""
    numa_host.flavors.create(
        {
            "name": "one-node-devices",
            "resources": {"VCPU": 2, "MEMORY_MB": 1024, VF: 1, "VGPU": 1},
            "extra_specs": {"hw:numa_nodes": "1"},
        }
    )
    vm, placed = place(numa_host, "one-node-devices")
    assert placed.host == "n", placed.error
    assert numa_host.allocations.pending_for_vm(vm) == {
        "n_numa0": {"VCPU": 2, "MEMORY_MB": 1024},
        "n_0000:3B:00.0": {VF: 1},
        "n_gpu": {"VGPU": 1},
    }


def test_capacity_and_explain_count_devices_like_any_class(dlm: Loadmaster) -> None:
    assert dlm.scheduler.capacity("vf").per_host == {"h1": 8}
    uuids = vms(dlm, 8)
    for vm in uuids[:6]:
        assert dlm.scheduler.schedule([RequestSpec(vms=[vm])]).placements[0].host == "h1"
    assert dlm.scheduler.capacity("vf").per_host == {"h1": 2}
    for vm in uuids[6:]:
        dlm.scheduler.schedule([RequestSpec(vms=[vm])])
    full = dlm.scheduler.capacity("vf")
    assert full.total == 0
    assert full.limits["h1"].startswith(f"{VF} short by 1 (free 0 of"), full.limits
    explained = dlm.scheduler.explain(RequestSpec(flavor="vf"))
    assert explained.candidates == 0
    [removed] = [f for f in explained.filters if f.removed]
    assert (removed.filter, removed.reasons) == ("resources", {f"short of {VF}": 1})


def test_an_aliass_traits_bind_the_provider_its_devices_come_from(dlm: Loadmaster) -> None:
    """Only PF0 has CUSTOM_PHYSNET1: VMs asking vf-physnet1 take PF0's VFs and no other,
    though PF1 has VFs of the same class free; a plain vf takes what is left anywhere."""
    dlm.hosts.set_traits(PFS[1], ["COMPUTE_MANAGED_PCI_DEVICE"])
    dlm.flavors.create(alias_flavor("vf-physnet1:1", "physnet1"))
    assert dlm.flavors.get("physnet1").class_traits == {VF: ("CUSTOM_PHYSNET1",)}
    # A plain VF first: it lands on PF0, the first with room, leaving PF0 three.
    [plain] = vms(dlm, 1)
    assert dlm.scheduler.schedule([RequestSpec(vms=[plain])]).placements[0].host == "h1"
    uuids = vms(dlm, 4, "physnet1")
    placed = [dlm.scheduler.schedule([RequestSpec(vms=[u])]).placements[0] for u in uuids]
    assert [p.host for p in placed[:3]] == ["h1"] * 3
    assert used_vfs(dlm) == [4, 0]
    assert placed[3].host is None
    assert "no provider with the traits its devices need has room" in str(placed[3].error)
    with pytest.raises(InsufficientCapacity):
        dlm.allocations.claim(uuids[3], "h1")
    assert used_vfs(dlm) == [4, 0]
    assert audit(dlm.store) == []


def test_a_numbered_group_binds_its_traits_to_its_resources(dlm: Loadmaster) -> None:
    dlm.hosts.set_traits(PFS[1], ["COMPUTE_MANAGED_PCI_DEVICE"])
    made = dlm.flavors.create(
        {
            "name": "grouped",
            "resources": {"VCPU": 1},
            "extra_specs": {
                f"resources1:{VF}": "2",
                "trait1:CUSTOM_PHYSNET1": "required",
                "group_policy": "none",
            },
        }
    )
    assert made.resources == {"VCPU": 1, VF: 2}
    assert made.class_traits == {VF: ("CUSTOM_PHYSNET1",)}
    assert made.required_traits == ()
    uuids = vms(dlm, 3, "grouped")
    hosts = [dlm.scheduler.schedule([RequestSpec(vms=[u])]).placements[0].host for u in uuids]
    assert hosts == ["h1", "h1", None]
    assert used_vfs(dlm) == [4, 0]


@pytest.mark.parametrize(
    ("specs", "field", "words"),
    [
        (
            {f"resources1:{VF}": "1", "trait1:CUSTOM_PHYSNET1": "forbidden"},
            "trait1:CUSTOM_PHYSNET1",
            "required ones",
        ),
        ({f"resources1:{VF}": "1", "group_policy": "isolate"}, "group_policy", "not modelled"),
        (
            {f"resources1:{VF}": "1", "trait2:CUSTOM_PHYSNET1": "required"},
            "trait2",
            "asks no resources",
        ),
        ({f"resources1:{VF}": "1", f"resources:{VF}": "1"}, f"resources1:{VF}", "one group"),
        ({f"resources1:{VF}": "x"}, f"resources1:{VF}", "integer"),
    ],
)
def test_a_bad_request_group_is_refused_naming_it(
    dlm: Loadmaster, specs: dict[str, str], field: str, words: str
) -> None:
    with pytest.raises(ValidationError) as err:
        dlm.flavors.create({"name": "g", "resources": {"VCPU": 1}, "extra_specs": specs})
    assert err.value.field == f"extra_specs.{field}"
    assert words in str(err.value)
    with pytest.raises(NotFound) as missing:
        dlm.flavors.create(
            {"name": "g", "resources": {"VCPU": 1}, "extra_specs": {"resources1:CUSTOM_NOPE": "1"}}
        )
    assert missing.value.field == "extra_specs.resources1:CUSTOM_NOPE"
    assert [f.name for f in dlm.flavors.list()] == ["vf"]


def test_a_direct_nic_flavor_puts_vnic_type_on_its_vms_nics(dlm: Loadmaster) -> None:
    before = [f.name for f in dlm.flavors.list()]
    for extra, words in (
        ({"lm:vnic_type": "macvtap"}, "a NIC is a VF of the VM's (direct)"),
        ({"lm:vnic_type": "direct"}, "ask the VF with pci_passthrough:alias"),
    ):
        with pytest.raises(ValidationError) as err:
            dlm.flavors.create({"name": "x", "resources": {"VCPU": 1}, "extra_specs": extra})
        assert err.value.field == "extra_specs.lm:vnic_type"
        assert words in str(err.value)
    assert [f.name for f in dlm.flavors.list()] == before
    dlm.flavors.create(
        {
            "name": "direct",
            "resources": {"VCPU": 1, "MEMORY_MB": 256},
            "extra_specs": {"pci_passthrough:alias": "vf:1", "lm:vnic_type": "direct"},
        }
    )
    vms = [dlm.vms.create("direct-vm", "direct").uuid, dlm.vms.create("plain-vm", "vf").uuid]
    dlm.scheduler.schedule([RequestSpec(vms=vms)])
    items = {i.vm: i for i in dlm.host_agents.work("h1").items}
    [nic] = items[vms[0]].nics
    assert nic["vnic_type"] == "direct" and nic["mac"] == dlm.vms.get(vms[0]).nics[0].mac
    assert "vnic_type" not in items[vms[1]].nics[0]


# -- an alias's device_type and numa_policy ------------------------------------------

KIND_ALIASES = json.dumps(
    [
        {"name": "vf", "resource_class": "CUSTOM_NIC", "device_type": "type-VF"},
        {"name": "pf", "resource_class": "CUSTOM_NIC", "device_type": "type-PF"},
        {"name": "any", "resource_class": "CUSTOM_NIC"},
        {"name": "near", "resource_class": VF, "numa_policy": "required"},
        {"name": "loose", "resource_class": VF, "numa_policy": "preferred"},
    ]
)


@pytest.fixture
def kinds(db_url: str) -> Any:
    """Host k: PF 0000:3b:00.1 offered whole and the first PF's VFs, both as CUSTOM_NIC
    (each provider tagged with its devices' kind); host h1's VFs as in ``dlm``."""
    service = loadmaster.open(db_url, settings=Settings(pci_aliases=KIND_ALIASES))
    try:
        register_devices(service)
        config = ManagerConfig.from_dict(
            {
                "pci": {
                    "device_spec": [
                        {"address": "0000:3b:00.1", "resource_class": "nic"},
                        {"address": "0000:3b:02.*", "resource_class": "nic"},
                    ]
                }
            }
        )
        nodes = parse_node_devices(LibvirtDevices(DEVICES_URI).node_device_xmls())
        found = device_providers("k", nodes, config.devices)
        info = SimulatedHypervisor([], host_memory_kib=64 * GIB).host_info()
        service.host_agents.register(
            "k", hypervisor_uri="test:///k", **discover(info, config, "k", found)
        )
        yield service
    finally:
        service.close()


def test_an_aliass_device_type_takes_only_that_kind_of_device(kinds: Loadmaster) -> None:
    placed = {}
    for alias in ("vf", "pf", "any"):
        kinds.flavors.create(alias_flavor(f"{alias}:1", alias))
        vm = kinds.vms.create(f"{alias}-vm", alias).uuid
        kinds.scheduler.schedule([RequestSpec(vms=[vm])])
        placed[alias] = sorted(
            p for p, a in kinds.allocations.pending_for_vm(vm).items() if "CUSTOM_NIC" in a
        )
    assert placed["vf"] == ["k_0000:3B:00.0"]
    assert placed["pf"] == ["k_0000:3B:00.1"]
    assert placed["any"] == ["k_0000:3B:00.0"]  # either kind; the PF was taken
    # The PF is taken: a second VM asking a PF finds no host, saying why.
    vm = kinds.vms.create("pf-vm-2", "pf").uuid
    [refused] = kinds.scheduler.schedule([RequestSpec(vms=[vm])]).placements
    assert isinstance(refused.error, NoHostFits)
    assert kinds.allocations.pending_for_vm(vm) == {}


def test_an_aliass_numa_policy_is_the_flavors_unless_it_sets_its_own(kinds: Loadmaster) -> None:
    made = kinds.flavors.create(alias_flavor("near", "near"))
    assert made.extra_specs["hw:pci_numa_affinity_policy"] == "required"
    own = kinds.flavors.create(
        alias_flavor("near", "own", {"hw:pci_numa_affinity_policy": "legacy"})
    )
    assert own.extra_specs["hw:pci_numa_affinity_policy"] == "legacy"
    with pytest.raises(ValidationError) as err:
        kinds.flavors.create(alias_flavor("near,loose", "both"))
    assert err.value.field == "extra_specs.pci_passthrough:alias"
    assert "different NUMA policies (loose preferred, near required)" in str(err.value)


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ({"device_type": "type-NIC"}, "device_type", "type-PCI, type-PF, type-VF"),
        ({"numa_policy": "strict"}, "numa_policy", "required, legacy, preferred"),
        ({"numa_policy": "socket"}, "numa_policy", "not the sockets they sit on"),
    ],
)
def test_a_bad_device_type_or_numa_policy_is_refused_naming_it(
    entry: dict[str, str], field: str, words: str
) -> None:
    from loadmaster.resources.aliases import parse_aliases

    with pytest.raises(ValidationError) as err:
        parse_aliases(json.dumps([{"name": "a", "resource_class": "VGPU", **entry}]))
    assert err.value.field == f"pci_aliases[0].{field}"
    assert words in str(err.value)
