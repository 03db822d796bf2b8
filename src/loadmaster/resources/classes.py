"""Resource classes: the kinds of quantity a host offers and a VM consumes.

Standard classes are os-resource-classes' (what Placement users know); operators add
their own as ``CUSTOM_*`` (a GPU model, a licence, "one of these per host").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import os_resource_classes

from loadmaster.errors import ValidationError

CUSTOM_PREFIX = "CUSTOM_"
_CUSTOM_NAME = re.compile(r"^CUSTOM_[A-Z0-9_]+$")
MAX_NAME_LENGTH = 255
V = TypeVar("V")


@dataclass(frozen=True)
class ResourceClass:
    name: str
    kind: str
    unit: str
    description: str = ""

    @property
    def standard(self) -> bool:
        return not self.name.startswith(CUSTOM_PREFIX)


# What loadmaster adds to os-resource-classes' names: a kind, a unit and a description.
_DETAILS: dict[str, tuple[str, str, str]] = {
    "VCPU": ("cpu", "vcpu", "Shared virtual CPUs, overcommittable"),
    "PCPU": ("cpu", "pcpu", "Dedicated physical CPUs for pinned guests"),
    "MEMORY_MB": ("memory", "MiB", "Guest memory"),
    "DISK_GB": ("storage", "GiB", "Local disk"),
    "IPV4_ADDRESS": ("network", "address", "IPv4 addresses"),
    "SRIOV_NET_VF": ("network", "vf", "SR-IOV virtual functions"),
    "NET_BW_EGR_KILOBIT_PER_SEC": ("network", "kbit/s", "Egress bandwidth"),
    "NET_BW_IGR_KILOBIT_PER_SEC": ("network", "kbit/s", "Ingress bandwidth"),
    "PCI_DEVICE": ("device", "device", "Passthrough PCI devices"),
    "VGPU": ("accelerator", "vgpu", "Virtual GPUs (mediated devices)"),
    "VGPU_DISPLAY_HEAD": ("accelerator", "head", "Display heads of virtual GPUs"),
    "MEM_ENCRYPTION_CONTEXT": ("security", "context", "Memory encryption slots"),
}

# os-resource-classes' list (pinned), in its order, as Placement serves it.
STANDARD_CLASSES: tuple[ResourceClass, ...] = tuple(
    ResourceClass(name, *_DETAILS.get(name, ("other", "unit", "")))
    for name in os_resource_classes.STANDARDS
)

STANDARD_BY_NAME = {rc.name: rc for rc in STANDARD_CLASSES}
_STANDARD_INDEX = {rc.name: i for i, rc in enumerate(STANDARD_CLASSES)}


def class_order(name: str) -> int:
    """Sort key of Placement's order: standard classes as os-resource-classes lists them
    (their ids in Placement), custom ones after. Among custom ones a stable sort keeps
    the caller's order (creation, where it has it)."""
    return _STANDARD_INDEX.get(name, len(_STANDARD_INDEX))


def in_class_order(by_class: Mapping[str, V]) -> dict[str, V]:
    """A per-class mapping in Placement's order, custom classes by name after the rest."""
    return dict(sorted(by_class.items(), key=lambda item: (class_order(item[0]), item[0])))


def validate_custom_name(name: object, field: str = "name") -> str:
    """Return ``name`` if it is a well-formed custom class name, else raise naming the rule."""
    if not isinstance(name, str) or not name:
        raise ValidationError(f"{field} must be a non-empty string", field=field)
    if len(name) > MAX_NAME_LENGTH:
        raise ValidationError(f"{field} is longer than {MAX_NAME_LENGTH} characters", field=field)
    if not _CUSTOM_NAME.match(name):
        raise ValidationError(
            f"{field} {name!r} is not a custom resource class: it must match CUSTOM_[A-Z0-9_]+",
            field=field,
        )
    return name


def validate_descriptor(value: object, field: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise ValidationError(f"{field} must be a non-empty string", field=field)
    if len(value) > MAX_NAME_LENGTH:
        raise ValidationError(f"{field} is longer than {MAX_NAME_LENGTH} characters", field=field)
    return value
