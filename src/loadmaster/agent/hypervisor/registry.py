"""The hypervisor drivers, found by entry point as the SLA loop's collectors and
controllers are. The driver is chosen by name (``--driver``, or ``driver`` in the host's
config file; default ``libvirt``) from ``loadmaster.hypervisors``, whose entries take
``DriverOptions`` and return a ``Hypervisor`` (with a ``close()`` if it holds a
connection). A third party adds one in its own pyproject, without touching loadmaster::

    [project.entry-points."loadmaster.hypervisors"]
    firecracker = "mypkg.fc:FirecrackerHypervisor.from_options"
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from loadmaster.errors import ValidationError

if TYPE_CHECKING:
    from loadmaster.agent.hypervisor.base import GuestImage, Hypervisor
    from loadmaster.agent.hypervisor.storage import StorageConfig

HYPERVISOR_GROUP = "loadmaster.hypervisors"
DEFAULT_DRIVER = "libvirt"


@dataclass(frozen=True)
class DriverOptions:
    """What the agent hands a hypervisor driver: the URI it was given, where KSM lives
    (None: the driver's default), how launched guests boot and where live-migration data
    goes, and where guests' disks and base images are (drivers that cannot launch or
    migrate ignore them)."""

    uri: str
    sys_root: Path | None = None
    guest_image: GuestImage | None = None
    migration_uri: str | None = None
    storage: StorageConfig | None = None


def open_hypervisor(driver: str, options: DriverOptions) -> Hypervisor:
    """The named driver, connected; an unknown name is an error naming the known ones."""
    found = {ep.name: ep for ep in entry_points(group=HYPERVISOR_GROUP)}
    if driver not in found:
        raise ValidationError(
            f"driver {driver!r} is not a registered hypervisor driver "
            f"(known: {', '.join(sorted(found))})",
            field="driver",
        )
    hypervisor: Hypervisor = found[driver].load()(options)
    return hypervisor
