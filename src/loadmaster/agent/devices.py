"""Host devices: PCI passthrough, SR-IOV virtual functions and mediated devices (vGPUs) as
nested providers of the host, as Nova reports them with PCI-in-Placement.

The agent reads libvirt's node devices (``parse_node_devices``), keeps those the
operator's device spec matches (the agent config's ``[pci] device_spec``, Nova's
``[pci] device_spec``; ``[devices] enabled_mdev_types``) and turns them into providers
(``device_providers``):

- a matched PCI device or SR-IOV PF: one provider ``<host>_<ADDRESS upper>``; matched VFs
  count on their PF's provider (a PF and its VFs cannot both be matched, and the VFs of
  one PF share a class and traits);
- the class is the spec's ``resource_class`` (a name not standard becomes ``CUSTOM_*``),
  else ``CUSTOM_PCI_<VENDOR>_<PRODUCT>``; the traits are the spec's (normalised the same
  way) plus ``COMPUTE_MANAGED_PCI_DEVICE``;
- a device offering an enabled mediated-device type: one provider
  ``<host>_<node-device name>`` of ``mdev_class`` (``VGPU``), as many as the type's
  available instances (one type per physical GPU, the first enabled one it offers).

Unlike Nova's, each provider keeps the NUMA node of its devices, which the scheduler
judges ``hw:pci_numa_affinity_policy`` by.
"""

from __future__ import annotations

import fnmatch
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadmaster.errors import ValidationError
from loadmaster.resources import STANDARD_BY_NAME, STANDARD_TRAITS

MANAGED_TRAIT = "COMPUTE_MANAGED_PCI_DEVICE"
DEFAULT_MDEV_CLASS = "VGPU"
PCI_KINDS = ("type-PCI", "type-PF", "type-VF")
_HEX4 = re.compile(r"^[0-9a-f]{4}$")
_NOT_NAME = re.compile(r"[^A-Z0-9_]")
_SPEC_KEYS = ("vendor_id", "product_id", "address", "resource_class", "traits")


@dataclass(frozen=True)
class PciDevice:
    """One PCI device as libvirt's node-device API describes it."""

    name: str  # the node device's name, pci_0000_3b_02_0
    address: str  # 0000:3b:02.0
    vendor_id: str  # four lower-case hex digits
    product_id: str
    kind: str  # type-PCI, type-PF or type-VF
    parent_address: str | None = None  # a VF's PF
    numa_node: int | None = None
    # Enabled-or-not mediated-device types it offers: type id -> available instances.
    mdev_types: Mapping[str, int] = field(default_factory=dict)
    ifname: str | None = None  # its network interface, if it has one


def _hex(text: str | None, width: int) -> str:
    return format(int(text or "0", 0), f"0{width}x")


def _address(element: ET.Element) -> str:
    return (
        f"{_hex(element.get('domain'), 4)}:{_hex(element.get('bus'), 2)}:"
        f"{_hex(element.get('slot'), 2)}.{_hex(element.get('function'), 1)}"
    )


def parse_node_devices(xmls: Iterable[str]) -> tuple[PciDevice, ...]:
    """The PCI devices among libvirt node-device descriptions (``XMLDesc``), each with the
    interface of its net child, in address order."""
    pci: list[tuple[str, ET.Element]] = []
    ifnames: dict[str, str] = {}
    for xml in xmls:
        device = ET.fromstring(xml)
        name = device.findtext("name") or ""
        cap = device.find("capability")
        if cap is None:
            continue
        if cap.get("type") == "pci":
            pci.append((name, cap))
        elif cap.get("type") == "net" and cap.findtext("interface"):
            ifnames[device.findtext("parent") or ""] = cap.findtext("interface") or ""
    devices = []
    for name, cap in pci:
        address = (
            f"{_hex(cap.findtext('domain'), 4)}:{_hex(cap.findtext('bus'), 2)}:"
            f"{_hex(cap.findtext('slot'), 2)}.{_hex(cap.findtext('function'), 1)}"
        )
        vendor, product = cap.find("vendor"), cap.find("product")
        numa = cap.find("numa")
        kind, parent = "type-PCI", None
        for sub in cap.findall("capability"):
            if sub.get("type") == "virt_functions" and sub.find("address") is not None:
                kind = "type-PF"
            elif sub.get("type") == "phys_function" and (pf := sub.find("address")) is not None:
                kind, parent = "type-VF", _address(pf)
        mdev_types = {
            str(t.get("id")): int(t.findtext("availableInstances") or 0)
            for sub in cap.findall("capability")
            if sub.get("type") == "mdev_types"
            for t in sub.findall("type")
        }
        devices.append(
            PciDevice(
                name=name,
                address=address,
                vendor_id=_hex(vendor.get("id") if vendor is not None else None, 4),
                product_id=_hex(product.get("id") if product is not None else None, 4),
                kind=kind,
                parent_address=parent,
                numa_node=int(numa.get("node", "-1")) if numa is not None else None,
                mdev_types=mdev_types,
                ifname=ifnames.get(name),
            )
        )
    return tuple(sorted(devices, key=lambda d: d.address))


# -- the operator's spec ---------------------------------------------------------------


def normalize_class(name: str) -> str:
    """A standard class as it is; anything else as ``CUSTOM_<NAME>`` (``vf-physnet2`` is
    ``CUSTOM_VF_PHYSNET2``), as Nova normalises a device spec's ``resource_class``."""
    upper = name.upper()
    if upper in STANDARD_BY_NAME or upper.startswith("CUSTOM_"):
        return _NOT_NAME.sub("_", upper)
    return "CUSTOM_" + _NOT_NAME.sub("_", upper)


def normalize_trait(name: str) -> str:
    """A standard trait as it is; anything else as ``CUSTOM_<NAME>`` (``physnet1``)."""
    upper = _NOT_NAME.sub("_", name.upper())
    if upper in STANDARD_TRAITS or upper.startswith("CUSTOM_"):
        return upper
    return "CUSTOM_" + upper


@dataclass(frozen=True)
class DeviceSpec:
    """One entry of ``[pci] device_spec``: which devices (vendor, product, address glob;
    an absent field matches any) and how they are offered."""

    where: str
    vendor_id: str | None = None
    product_id: str | None = None
    address: str | None = None
    resource_class: str | None = None
    traits: frozenset[str] = frozenset()

    def matches(self, device: PciDevice) -> bool:
        return (
            (self.vendor_id is None or device.vendor_id == self.vendor_id)
            and (self.product_id is None or device.product_id == self.product_id)
            and (self.address is None or fnmatch.fnmatchcase(device.address, self.address))
        )


@dataclass(frozen=True)
class DeviceConfig:
    specs: tuple[DeviceSpec, ...] = ()
    mdev_types: tuple[str, ...] = ()
    mdev_class: str = DEFAULT_MDEV_CLASS

    @property
    def empty(self) -> bool:
        return not self.specs and not self.mdev_types


def _text(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValidationError(f"{where}.{key} must be a non-empty string", field=f"{where}.{key}")
    return value


def _hex_id(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    value = _text(entry, key, where)
    if value is None:
        return None
    normal = value.lower().removeprefix("0x")
    if not _HEX4.match(normal):
        raise ValidationError(
            f"{where}.{key} must be four hex digits (8086), got {value!r}", field=f"{where}.{key}"
        )
    return normal


def _names(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValidationError(f"{where} must be a list of names", field=where)
    return tuple(value)


def parse_device_config(
    pci: Mapping[str, Any], devices: Mapping[str, Any], where: str = "config"
) -> DeviceConfig:
    """``[pci]`` (``device_spec``: a list of tables) and ``[devices]``
    (``enabled_mdev_types``, ``mdev_class``) of the agent's config; an error names the
    field and why."""
    for key in pci:
        if key != "device_spec":
            raise ValidationError(f"{where}: pci.{key} is not a setting", field=f"pci.{key}")
    for key in devices:
        if key not in ("enabled_mdev_types", "mdev_class"):
            raise ValidationError(
                f"{where}: devices.{key} is not a setting", field=f"devices.{key}"
            )
    raw = pci.get("device_spec", [])
    if not isinstance(raw, list):
        raise ValidationError(
            f"{where}: pci.device_spec must be a list of tables", field="pci.device_spec"
        )
    specs = []
    for i, entry in enumerate(raw):
        at = f"pci.device_spec[{i}]"
        if not isinstance(entry, Mapping):
            raise ValidationError(f"{where}: {at} must be a table", field=at)
        unknown = sorted(set(entry) - set(_SPEC_KEYS))
        if unknown:
            raise ValidationError(
                f"{where}: {at}.{unknown[0]} is not a device spec field "
                f"(known: {', '.join(_SPEC_KEYS)})",
                field=f"{at}.{unknown[0]}",
            )
        vendor = _hex_id(entry, "vendor_id", at)
        product = _hex_id(entry, "product_id", at)
        address = _text(entry, "address", at)
        if vendor is None and product is None and address is None:
            raise ValidationError(
                f"{where}: {at} matches every device: give vendor_id, product_id or address",
                field=at,
            )
        rc = _text(entry, "resource_class", at)
        traits = _names(entry.get("traits", []), f"{at}.traits")
        specs.append(
            DeviceSpec(
                at,
                vendor,
                product,
                address.lower() if address else None,
                normalize_class(rc) if rc else None,
                frozenset(normalize_trait(t) for t in traits),
            )
        )
    mdev_class = _text(devices, "mdev_class", "devices") or DEFAULT_MDEV_CLASS
    return DeviceConfig(
        tuple(specs),
        _names(devices.get("enabled_mdev_types", []), "devices.enabled_mdev_types"),
        normalize_class(mdev_class),
    )


# -- providers -------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceProvider:
    """A child provider of the host holding ``total`` devices of ``resource_class``:
    ``devices`` are the addresses a guest is given (a PF's VFs, the device itself), or
    for a mediated-device type the parent's address, ``total`` times over."""

    name: str
    resource_class: str
    traits: frozenset[str]
    numa_node: int | None
    devices: tuple[str, ...]
    mdev_type: str | None = None
    total: int = 0


@dataclass(frozen=True)
class Discovery:
    providers: tuple[DeviceProvider, ...] = ()
    # The specs (and mdev types) that matched no device, each named.
    unmatched: tuple[str, ...] = ()


def device_providers(host: str, devices: Sequence[PciDevice], config: DeviceConfig) -> Discovery:
    """The providers ``config`` makes of ``devices`` (see the module docstring); a spec
    that gives one PF's VFs different classes or traits, or matches a PF and its VFs,
    is an error naming it."""
    matched: dict[str, tuple[PciDevice, DeviceSpec]] = {}
    used: set[str] = set()
    for device in devices:
        spec = next((s for s in config.specs if s.matches(device)), None)
        if spec is not None:
            matched[device.address] = (device, spec)
            used.add(spec.where)
    groups: dict[str, list[tuple[PciDevice, DeviceSpec]]] = {}
    for device, spec in matched.values():
        owner = device.parent_address if device.kind == "type-VF" else device.address
        assert owner is not None
        groups.setdefault(owner, []).append((device, spec))
    providers = []
    for owner, members in sorted(groups.items()):
        vfs = [(d, s) for d, s in members if d.kind == "type-VF"]
        if vfs and len(vfs) != len(members):
            spec = next(s for d, s in members if d.kind != "type-VF")
            raise ValidationError(
                f"{spec.where} matches PF {owner} and {vfs[0][1].where} its VFs; a PF and "
                "its VFs cannot both be offered",
                field=spec.where,
            )
        first, first_spec = members[0]
        rc = first_spec.resource_class or (
            f"CUSTOM_PCI_{first.vendor_id.upper()}_{first.product_id.upper()}"
        )
        for device, spec in members[1:]:
            other = spec.resource_class or (
                f"CUSTOM_PCI_{device.vendor_id.upper()}_{device.product_id.upper()}"
            )
            if other != rc or spec.traits != first_spec.traits:
                raise ValidationError(
                    f"{spec.where} gives VF {device.address} another class or traits than "
                    f"{first_spec.where} gives {first.address}; the VFs of PF {owner} share them",
                    field=spec.where,
                )
        providers.append(
            DeviceProvider(
                name=f"{host}_{owner.upper()}",
                resource_class=rc,
                traits=first_spec.traits | {MANAGED_TRAIT},
                numa_node=first.numa_node,
                devices=tuple(d.address for d, _ in members),
                total=len(members),
            )
        )
    seen_types: set[str] = set()
    for device in devices:
        kind = next((t for t in config.mdev_types if t in device.mdev_types), None)
        if kind is None:
            continue
        seen_types.add(kind)
        providers.append(
            DeviceProvider(
                name=f"{host}_{device.name}",
                resource_class=config.mdev_class,
                traits=frozenset(),
                numa_node=device.numa_node,
                devices=(device.address,),
                mdev_type=kind,
                total=device.mdev_types[kind],
            )
        )
    unmatched = [s.where for s in config.specs if s.where not in used]
    unmatched += [
        f"devices.enabled_mdev_types {t}" for t in config.mdev_types if t not in seen_types
    ]
    return Discovery(tuple(providers), tuple(unmatched))


def registration_children(
    discovery: Discovery,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """The providers as the registration body's ``children`` (inventories by provider)
    and ``child_traits``."""
    offered = [p for p in discovery.providers if p.total > 0]
    children = {
        p.name: {p.resource_class: {"total": p.total, "max_unit": p.total, "allocation_ratio": 1.0}}
        for p in offered
    }
    return children, {p.name: sorted(p.traits) for p in offered}


class LibvirtDevices:
    """Node devices from a read-only libvirt connection of their own (the driver's
    connection is the guests'). On the test driver a second connection to the same
    file sees the same node devices."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def node_device_xmls(self) -> list[str]:
        import libvirt

        conn = libvirt.openReadOnly(self.uri)
        try:
            return [d.XMLDesc(0) for d in conn.listAllDevices(0)]
        finally:
            conn.close()
