"""The devices of a simulated host, as libvirt's node-device API describes them: SR-IOV
PFs (Intel X710, 8086:1572) with their VFs (8086:154c), each with a network interface,
and a GPU (NVIDIA T4, 10de:1eb8) offering two mediated-device types. The simulator hands
them to the agent as a real host's libvirt would (``SimulatedHypervisor(node_devices=)``);
the agent's device spec decides what is offered."""

from __future__ import annotations

VF_VENDOR, VF_PRODUCT = "8086", "154c"
MDEV_TYPES = {"nvidia-222": 16, "nvidia-223": 8}


def _pci(name: str, parent: str, bus: int, slot: int, function: int, ids: str, body: str) -> str:
    vendor, product = ids.split(":")
    return (
        f"<device><name>{name}</name><parent>{parent}</parent><capability type='pci'>"
        f"<domain>0</domain><bus>{bus}</bus><slot>{slot}</slot><function>{function}</function>"
        f"<product id='0x{product}'/><vendor id='0x{vendor}'/>{body}</capability></device>"
    )


def _address(bus: int, slot: int, function: int) -> str:
    return (
        f"<address domain='0x0000' bus='{bus:#04x}' slot='{slot:#04x}' function='{function:#x}'/>"
    )


def _net(parent: str, ifname: str, mac: str) -> str:
    return (
        f"<device><name>net_{ifname}</name><parent>{parent}</parent><capability type='net'>"
        f"<interface>{ifname}</interface><address>{mac}</address></capability></device>"
    )


def node_device_xmls(pfs: int = 2, vfs_per_pf: int = 4, gpus: int = 1) -> list[str]:
    """``pfs`` PFs of ``vfs_per_pf`` VFs on bus 0x3b, NUMA node 0; ``gpus`` GPUs from bus
    0xaf on, NUMA node 1."""
    out = []
    bus = 0x3B
    for pf in range(pfs):
        name = f"pci_0000_3b_00_{pf}"
        vfs = [(2 + pf, f) for f in range(vfs_per_pf)]
        body = (
            f"<capability type='virt_functions' maxCount='64'>"
            f"{''.join(_address(bus, s, f) for s, f in vfs)}</capability><numa node='0'/>"
        )
        out.append(_pci(name, "computer", bus, 0, pf, "8086:1572", body))
        out.append(_net(name, f"enp59s0f{pf}", f"3c:fd:fe:00:00:{pf:02x}"))
        for slot, function in vfs:
            vf = f"pci_0000_3b_{slot:02x}_{function}"
            body = (
                f"<capability type='phys_function'>{_address(bus, 0, pf)}</capability>"
                "<numa node='0'/>"
            )
            out.append(_pci(vf, name, bus, slot, function, f"{VF_VENDOR}:{VF_PRODUCT}", body))
            out.append(
                _net(vf, f"enp59s{slot}f{pf}v{function}", f"52:54:00:3b:{slot:02x}:{function:02x}")
            )
    for gpu in range(gpus):
        gpu_bus = 0xAF + gpu
        types = "".join(
            f"<type id='{kind}'><deviceAPI>vfio-pci</deviceAPI>"
            f"<availableInstances>{count}</availableInstances></type>"
            for kind, count in MDEV_TYPES.items()
        )
        body = f"<capability type='mdev_types'>{types}</capability><numa node='1'/>"
        out.append(
            _pci(f"pci_0000_{gpu_bus:02x}_00_0", "computer", gpu_bus, 0, 0, "10de:1eb8", body)
        )
    return out
