"""What the agent needs from a hypervisor, and the drivers that give it.

``Hypervisor`` (``base``) is the protocol the host manager and the SLA loop call, with
its value types (``GuestInfo``, ``GuestSpec``, ``CpuTune``, ...) and the ranges libvirt
accepts for the tuning calls. Drivers are found by name in the entry-point group
``loadmaster.hypervisors`` (``registry``: ``open_hypervisor``, ``DriverOptions``);
loadmaster ships ``libvirt`` (``libvirt``, with the libvirt helpers beside it:
``storage`` for guests' disks, ``networks`` for their NICs, ``shaping`` for NIC limits
the kernel cannot take from libvirt, ``devices`` for the host's PCI devices) and the
simulated host (``simulated``). Drivers import nothing of the manager or the SLA loop.
"""

from loadmaster.agent.hypervisor.base import (
    DiskSpec,
    GuestImage,
    GuestInfo,
    GuestSpec,
    Hypervisor,
    HypervisorError,
    NicSpec,
)
from loadmaster.agent.hypervisor.registry import DEFAULT_DRIVER, DriverOptions, open_hypervisor

__all__ = [
    "DEFAULT_DRIVER",
    "DiskSpec",
    "DriverOptions",
    "GuestImage",
    "GuestInfo",
    "GuestSpec",
    "Hypervisor",
    "HypervisorError",
    "NicSpec",
    "open_hypervisor",
]
