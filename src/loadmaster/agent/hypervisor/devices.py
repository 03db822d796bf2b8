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
  way) plus ``COMPUTE_MANAGED_PCI_DEVICE`` and the kind of its devices
  (``CUSTOM_PCI_DEVICE_TYPE_VF`` for a PF's VFs, ``_PF`` for a PF, ``_PCI`` for any other
  device), which an alias's ``device_type`` requires;
- a device offering an enabled mediated-device type: one provider
  ``<host>_<node-device name>`` of ``mdev_class`` (``VGPU``), as many as the type's
  available instances (one type per physical GPU, the first enabled one it offers).

Unlike Nova's, each provider keeps the NUMA node of its devices, which the scheduler
judges ``hw:pci_numa_affinity_policy`` by.
"""

from __future__ import annotations

import fnmatch
import re
import threading
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from loadmaster.errors import ValidationError
from loadmaster.resources import STANDARD_BY_NAME, STANDARD_TRAITS
from loadmaster.resources.aliases import DEVICE_TYPE_TRAITS, checked_entry

MANAGED_TRAIT = "COMPUTE_MANAGED_PCI_DEVICE"
DEFAULT_MDEV_CLASS = "VGPU"
_HEX4 = re.compile(r"^[0-9a-f]{4}$")
_NOT_NAME = re.compile(r"[^A-Z0-9_]")
_SPEC_KEYS = ("vendor_id", "product_id", "address", "resource_class", "traits")
T = TypeVar("T")


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
        entry = checked_entry(
            entry, _SPEC_KEYS, at, shape="a table", what="a device spec", where=where
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
    # What its devices are (``PCI_KINDS``: a PF's VFs are type-VF); None for mdevs.
    kind: str | None = None


@dataclass(frozen=True)
class Discovery:
    providers: tuple[DeviceProvider, ...] = ()
    # The specs (and mdev types) that matched no device, each named.
    unmatched: tuple[str, ...] = ()


def _class_of(device: PciDevice, spec: DeviceSpec) -> str:
    return (
        spec.resource_class or f"CUSTOM_PCI_{device.vendor_id.upper()}_{device.product_id.upper()}"
    )


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
        rc = _class_of(first, first_spec)
        for device, spec in members[1:]:
            if _class_of(device, spec) != rc or spec.traits != first_spec.traits:
                raise ValidationError(
                    f"{spec.where} gives VF {device.address} another class or traits than "
                    f"{first_spec.where} gives {first.address}; the VFs of PF {owner} share them",
                    field=spec.where,
                )
        providers.append(
            DeviceProvider(
                name=f"{host}_{owner.upper()}",
                resource_class=rc,
                traits=first_spec.traits | {MANAGED_TRAIT, DEVICE_TYPE_TRAITS[first.kind]},
                numa_node=first.numa_node,
                devices=tuple(d.address for d, _ in members),
                total=len(members),
                kind=first.kind,
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
    discovery: Discovery, nodes: Mapping[int, str]
) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]], dict[str, str]]:
    """The providers as the registration body's ``children`` (inventories by provider),
    ``child_traits`` and ``child_parents``: a device on a NUMA node the host registers
    (``nodes``: provider name by node id) goes under that node's provider, where the
    scheduler judges ``hw:pci_numa_affinity_policy`` by it; any other under the host."""
    offered = [p for p in discovery.providers if p.total > 0]
    children = {
        p.name: {p.resource_class: {"total": p.total, "max_unit": p.total, "allocation_ratio": 1.0}}
        for p in offered
    }
    parents = {
        p.name: nodes[p.numa_node]
        for p in offered
        if p.numa_node is not None and p.numa_node in nodes
    }
    return children, {p.name: sorted(p.traits) for p in offered}, parents


# -- devices given to guests -----------------------------------------------------------


@dataclass(frozen=True)
class HostDevice:
    """A device a guest is given: a PCI function (``address``) or, with ``mdev_type``, a
    mediated device ``mdev_uuid`` made on the PCI device at ``address``. With ``mac``, a
    VF given as the guest's NIC (``<interface type='hostdev'>``) with that MAC."""

    provider: str
    address: str
    mdev_type: str | None = None
    mdev_uuid: str | None = None
    mac: str | None = None

    @property
    def alias(self) -> str:
        """The hostdev's user alias in the domain XML: names the device the guest holds
        (an mdev's parent is in no other element), so the agent can read it back."""
        return (
            "ua-lm-"
            + re.sub(r"[^0-9a-f]", "_", self.address)
            + (f"-{self.mdev_uuid}" if self.mdev_uuid else "")
        )


def _as_nics(
    given: Sequence[HostDevice], providers: Mapping[str, DeviceProvider], macs: Sequence[str]
) -> list[HostDevice]:
    """``given`` with its first VFs made the NICs of ``macs``, in order."""
    vfs = [i for i, d in enumerate(given) if providers[d.provider].kind == "type-VF"]
    if len(vfs) < len(macs):
        raise DeviceShortage(
            f"its {len(macs)} NIC(s) of vnic_type direct need a VF each, but its claim "
            f"gives it {len(vfs)} here"
        )
    out = list(given)
    for i, mac in zip(vfs, macs, strict=False):
        out[i] = replace(out[i], mac=mac)
    return out


class DeviceShortage(Exception):
    """The claim names more devices of a provider than the agent has free there."""


class Assignments:
    """Which guest holds which of the host's devices. The ledger counts devices per
    provider; the agent gives each guest particular ones, and keeps that here (rebuilt
    from the guests' domain XML when it starts: ``restore``). Thread-safe: launches run
    in worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[HostDevice, ...]] = {}

    def held(self) -> dict[str, tuple[HostDevice, ...]]:
        with self._lock:
            return dict(self._held)

    def assign(
        self,
        vm: str,
        claimed: Mapping[str, Mapping[str, int]],
        discovery: Discovery,
        macs: Sequence[str] = (),
    ) -> tuple[HostDevice, ...]:
        """Free devices for what ``vm``'s claim holds on device providers (other children,
        NUMA nodes, are not devices); the ones it holds already if it has some. ``macs``:
        the VM's NICs that are VFs (``vnic_type`` direct), each given one of its VFs.
        Raises ``DeviceShortage`` naming the provider when too few are free, or when the
        claim gives fewer VFs than such NICs."""
        providers = {p.name: p for p in discovery.providers}
        device_classes = {p.resource_class for p in discovery.providers}
        with self._lock:
            if vm in self._held:
                return self._held[vm]
            taken = [d for devices in self._held.values() for d in devices]
            given: list[HostDevice] = []
            for name, amounts in sorted(claimed.items()):
                provider = providers.get(name)
                if provider is None:
                    unknown = sorted(set(amounts) & device_classes)
                    if unknown:
                        raise DeviceShortage(
                            f"the claim holds {', '.join(unknown)} of {name}, a provider "
                            "whose devices this agent does not offer"
                        )
                    continue
                count = amounts.get(provider.resource_class, 0)
                if provider.mdev_type is not None:
                    free = provider.total - sum(1 for d in taken if d.provider == name)
                    picked = [
                        HostDevice(
                            name,
                            provider.devices[0],
                            provider.mdev_type,
                            str(uuid.uuid5(uuid.NAMESPACE_URL, f"lm:{vm}:{name}:{i}")),
                        )
                        for i in range(count)
                    ]
                else:
                    used = {d.address for d in taken}
                    available = [a for a in provider.devices if a not in used]
                    free = len(available)
                    picked = [HostDevice(name, a) for a in available[:count]]
                if free < count:
                    raise DeviceShortage(
                        f"the claim holds {count} {provider.resource_class} of {name} but only "
                        f"{max(free, 0)} of its devices are free here"
                    )
                given += picked
            given = _as_nics(given, providers, macs)
            if given:
                self._held[vm] = tuple(given)
            return tuple(given)

    def release(self, vm: str) -> tuple[HostDevice, ...]:
        with self._lock:
            return self._held.pop(vm, ())

    def keep_only(self, vms: Set[str]) -> list[str]:
        """Free what guests not in ``vms`` hold (stopped, removed, moved away); the VMs freed."""
        with self._lock:
            gone = sorted(set(self._held) - vms)
            for vm in gone:
                del self._held[vm]
            return gone

    def restore(self, guests: Mapping[str, str], discovery: Discovery) -> None:
        """What the guests (uuid -> domain XML) hold, read from their hostdev elements:
        a PCI function by its address, a mediated device by the alias it was given."""
        providers = discovery.providers
        by_address = {a: p for p in providers if p.mdev_type is None for a in p.devices}
        mdevs = {p.devices[0]: p for p in providers if p.mdev_type is not None}
        with self._lock:
            for vm, xml in guests.items():
                held = []
                devices = ET.fromstring(xml).find("devices")
                elements = [] if devices is None else list(devices)
                for hostdev in elements:
                    source = hostdev.find("./source/address")
                    if hostdev.tag not in ("hostdev", "interface") or source is None:
                        continue
                    if hostdev.get("type") in ("pci", "hostdev"):
                        address = _address(source)
                        mac = hostdev.find("mac")
                        if address in by_address:
                            held.append(
                                HostDevice(
                                    by_address[address].name,
                                    address,
                                    mac=mac.get("address") if mac is not None else None,
                                )
                            )
                        continue
                    named = hostdev.find("alias")
                    alias = named.get("name", "") if named is not None else ""
                    for parent, p in mdevs.items():
                        if alias.startswith(HostDevice(p.name, parent).alias + "-"):
                            held.append(HostDevice(p.name, parent, p.mdev_type, source.get("uuid")))
                if held:
                    self._held[vm] = tuple(held)


def hostdev_elements(devices: ET.Element, given: Sequence[HostDevice]) -> None:
    """The domain XML's element for each device given (``hostdev_element``)."""
    for device in given:
        devices.append(hostdev_element(device))


def hostdev_element(device: HostDevice) -> ET.Element:
    """A ``<hostdev>``: a PCI function managed by libvirt (detached from its host driver
    while the guest runs), or a mediated device; a VF given as a NIC is an ``<interface
    type='hostdev'>`` with its MAC, which libvirt sets on the VF. Named by the device's
    alias."""
    if device.mdev_type is None:
        if device.mac is not None:
            hostdev = ET.Element("interface", type="hostdev", managed="yes")
            ET.SubElement(hostdev, "mac", address=device.mac)
        else:
            hostdev = ET.Element("hostdev", mode="subsystem", type="pci", managed="yes")
        domain, bus, rest = device.address.split(":")
        slot, function = rest.split(".")
        # An interface's source address names its bus type; a hostdev's is PCI already.
        kind = {"type": "pci"} if device.mac is not None else {}
        ET.SubElement(
            ET.SubElement(hostdev, "source"),
            "address",
            kind,
            domain=f"0x{domain}",
            bus=f"0x{bus}",
            slot=f"0x{slot}",
            function=f"0x{function}",
        )
    else:
        hostdev = ET.Element("hostdev", mode="subsystem", type="mdev", model="vfio-pci")
        ET.SubElement(ET.SubElement(hostdev, "source"), "address", uuid=str(device.mdev_uuid))
    ET.SubElement(hostdev, "alias", name=device.alias)
    return hostdev


def given_aliases(domain_xml: str) -> set[str]:
    """The aliases of the devices the agent gave the guest whose definition this is."""
    return {
        str(alias.get("name"))
        for alias in ET.fromstring(domain_xml).iterfind("./devices/*/alias")
        if str(alias.get("name", "")).startswith("ua-lm-")
    }


class DeviceSource(Protocol):
    """Where the agent reads the host's devices and what its guests hold of them."""

    def node_device_xmls(self) -> list[str]: ...

    def guest_xmls(self) -> dict[str, str]: ...


class LibvirtDevices:
    """Node devices and guests' definitions from a libvirt connection: its own read-only
    one to ``uri`` (the driver's connection is the guests'), or ``conn`` if given. On the
    test driver each connection is a host of its own: give it the driver's."""

    def __init__(self, uri: str, conn: Any = None) -> None:
        self.uri = uri
        self._conn = conn

    def _read(self, read: Callable[[Any], T]) -> T:
        if self._conn is not None:
            return read(self._conn)
        import libvirt

        conn = libvirt.openReadOnly(self.uri)
        try:
            return read(conn)
        finally:
            conn.close()

    def node_device_xmls(self) -> list[str]:
        return self._read(lambda conn: [d.XMLDesc(0) for d in conn.listAllDevices(0)])

    def guest_xmls(self) -> dict[str, str]:
        """Every guest's definition by uuid, running or not."""
        return self._read(
            lambda conn: {d.UUIDString(): d.XMLDesc(0) for d in conn.listAllDomains(0)}
        )
