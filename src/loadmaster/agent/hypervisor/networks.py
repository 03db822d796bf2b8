"""The host's libvirt networks that guests' NICs join.

A VM names a network (or its flavor does, or it gets ``default``); the host's operator
defines it in libvirt. A network the host does not define is refused, naming it and
those it does; one defined but not running is started, as libvirt's autostart would.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any

from loadmaster.agent.hypervisor.base import HypervisorError, NicSpec


def require_networks(conn: Any, lv: Any, names: Iterable[str]) -> None:
    """Every named network exists on this connection and runs."""
    for name in sorted(set(names)):
        try:
            net = conn.networkLookupByName(name)
        except lv.libvirtError as exc:
            if exc.get_error_code() != lv.VIR_ERR_NO_NETWORK:
                raise HypervisorError(f"network {name!r}: {exc}") from exc
            raise HypervisorError(
                f"network {name!r} is not defined on this host "
                f"(defined: {', '.join(_defined(conn, lv)) or 'none'})"
            ) from exc
        try:
            if not net.isActive():
                net.create()
        except lv.libvirtError as exc:
            raise HypervisorError(f"network {name!r}: cannot start it: {exc}") from exc


def _defined(conn: Any, lv: Any) -> list[str]:
    try:
        return sorted(n.name() for n in conn.listAllNetworks(0))
    except lv.libvirtError:
        return []


def interface_element(nic: NicSpec) -> ET.Element:
    """The domain's ``<interface>`` for one NIC: virtio, on its network, with its MAC."""
    iface = ET.Element("interface", type="network")
    ET.SubElement(iface, "mac", address=nic.mac)
    ET.SubElement(iface, "source", network=nic.network)
    ET.SubElement(iface, "model", type="virtio")
    return iface
