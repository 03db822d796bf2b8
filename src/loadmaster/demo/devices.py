"""The demo's host devices: its first hosts offer SR-IOV VFs and a GPU's vGPUs (the
simulator's node devices, ``agent/hypervisor/simulated_devices.py``); a VM asking a VF and one asking
a vGPU are started, and what each holds is shown as ``vm show`` and ``host show`` list it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from loadmaster.agent.hypervisor.devices import parse_device_config
from loadmaster.agent.hypervisor.simulated_devices import VF_PRODUCT, VF_VENDOR, node_device_xmls
from loadmaster.demo.cloud import HostPlan, SimulatedCloud

# How many of the demo's hosts have devices (two: one may be the drained host).
DEVICE_HOSTS = 2
VF_CLASS = f"CUSTOM_PCI_{VF_VENDOR.upper()}_{VF_PRODUCT.upper()}"
DEVICES = parse_device_config(
    {"device_spec": [{"vendor_id": VF_VENDOR, "product_id": VF_PRODUCT, "traits": ["physnet1"]}]},
    {"enabled_mdev_types": ["nvidia-222"]},
)
# (VM, flavor, what it asks besides 1 VCPU and 512 MiB, as extra specs)
DEVICE_VMS = (
    ("nfv-1", "sriov", {f"resources:{VF_CLASS}": "1"}),
    ("render-1", "vgpu", {"resources:VGPU": "1"}),
)


def plan(index: int, host: HostPlan) -> HostPlan:
    """The demo's ``index``-th host, with devices if it is one of the first."""
    if index >= DEVICE_HOSTS:
        return host
    return replace(
        host,
        config=replace(host.config, devices=DEVICES),
        node_devices=tuple(node_device_xmls()),
    )


def place_and_show(
    cloud: SimulatedCloud,
    progress: Callable[[str], None],
    wait_until: Callable[[Callable[[], bool], float], bool],
) -> None:
    """Start a VM with a VF and one with a vGPU, wait for their agents to say what they
    gave them, and show it."""
    admin = cloud.admin
    vms: dict[str, str] = {}
    for name, flavor, extra in DEVICE_VMS:
        body = {"name": flavor, "resources": {"VCPU": 1, "MEMORY_MB": 512}, "extra_specs": extra}
        admin.post("/flavors", json=body).raise_for_status()
        vm = admin.post("/vms", json={"name": name, "flavor": flavor})
        vm.raise_for_status()
        vms[name] = vm.json()["uuid"]
        admin.post(f"/vms/{vms[name]}/start").raise_for_status()

    def devices(uuid: str) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = admin.get(f"/vms/{uuid}/devices").json()["devices"]
        return got

    wait_until(lambda: all(devices(u) for u in vms.values()), 60)
    hosts: list[str] = []
    for name, uuid in vms.items():
        vm = admin.get(f"/vms/{uuid}").json()
        held = devices(uuid)
        if not held:
            progress(f"vm show {name}: {vm['state']} holding no device: {vm.get('fault')}")
            continue
        given = "; ".join(f"{d['provider']} {d['address']} {d['mdev_uuid'] or '-'}" for d in held)
        progress(f"vm show {name}: {vm['state']} on {vm['host']}, host devices: {given}")
        if vm["host"] not in hosts:
            hosts.append(vm["host"])
    for host in hosts:
        for d in admin.get(f"/hosts/{host}/devices").json()["devices"]:
            holders = ", ".join(
                f"{h['name']} ({','.join(g['address'] for g in h['devices']) or '-'})"
                for h in d["holders"]
            )
            progress(
                f"host show {host}: {d['provider']} {d['resource_class']} "
                f"{d['used']}/{d['total']} used, held by {holders or 'none'}"
            )
