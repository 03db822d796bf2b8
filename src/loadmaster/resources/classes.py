"""Resource classes: the kinds of quantity a host offers and a VM consumes.

Standard classes follow os-resource-classes (what Placement users know); operators add
their own as ``CUSTOM_*`` (a GPU model, a licence, "one of these per host").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loadmaster.errors import ValidationError

CUSTOM_PREFIX = "CUSTOM_"
_CUSTOM_NAME = re.compile(r"^CUSTOM_[A-Z0-9_]+$")
MAX_NAME_LENGTH = 255


@dataclass(frozen=True)
class ResourceClass:
    name: str
    kind: str
    unit: str
    description: str = ""

    @property
    def standard(self) -> bool:
        return not self.name.startswith(CUSTOM_PREFIX)


STANDARD_CLASSES: tuple[ResourceClass, ...] = (
    ResourceClass("VCPU", "cpu", "vcpu", "Shared virtual CPUs, overcommittable"),
    ResourceClass("PCPU", "cpu", "pcpu", "Dedicated physical CPUs for pinned guests"),
    ResourceClass("MEMORY_MB", "memory", "MiB", "Guest memory"),
    ResourceClass("MEMORY_HUGEPAGES_2M", "memory", "page", "2 MiB huge pages"),
    ResourceClass("MEMORY_HUGEPAGES_1G", "memory", "page", "1 GiB huge pages"),
    ResourceClass("DISK_GB", "storage", "GiB", "Local disk"),
    ResourceClass("IPV4_ADDRESS", "network", "address", "IPv4 addresses"),
    ResourceClass("SRIOV_NET_VF", "network", "vf", "SR-IOV virtual functions"),
    ResourceClass("NET_BW_EGR_KILOBIT_PER_SEC", "network", "kbit/s", "Egress bandwidth"),
    ResourceClass("NET_BW_IGR_KILOBIT_PER_SEC", "network", "kbit/s", "Ingress bandwidth"),
    ResourceClass("PCI_DEVICE", "device", "device", "Passthrough PCI devices"),
    ResourceClass("VGPU", "accelerator", "vgpu", "Virtual GPUs (mediated devices)"),
    ResourceClass("VGPU_DISPLAY_HEAD", "accelerator", "head", "Display heads of virtual GPUs"),
    ResourceClass("MEM_ENCRYPTION_CONTEXT", "security", "context", "Memory encryption slots"),
)

STANDARD_BY_NAME = {rc.name: rc for rc in STANDARD_CLASSES}


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
