"""Read-only records the services hand out; rows never leave a session."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from loadmaster.images import POOL_NAME, disk_bytes, volume_name
from loadmaster.resources import Inventory

HOST_STATES = ("up", "maintenance", "down")


@dataclass(frozen=True)
class GroupRecord:
    uuid: str
    name: str
    policy: str
    max_per_host: int | None

    @property
    def hard(self) -> bool:
        return not self.policy.startswith("soft-")


@dataclass(frozen=True)
class HostRecord:
    uuid: str
    name: str
    state: str
    generation: int
    parent: str | None
    root: str
    traits: tuple[str, ...]
    aggregates: tuple[str, ...]
    inventories: Mapping[str, Inventory]


@dataclass(frozen=True)
class FlavorRecord:
    name: str
    resources: Mapping[str, int]
    required_traits: tuple[str, ...]
    forbidden_traits: tuple[str, ...]
    extra_specs: Mapping[str, str] = field(default_factory=dict)
    # Extra specs kept but not applied; only the answer to a create carries them.
    warnings: tuple[str, ...] = ()
    # Per class, the traits the provider it is taken from must have (a PCI alias's).
    class_traits: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class VmRecord:
    uuid: str
    name: str
    project_id: str
    user_id: str
    flavor: str | None  # None: deleted, and its flavor was deleted since
    overrides: Mapping[str, int]
    tags: tuple[str, ...]
    state: str
    host: str | None
    target_host: str | None
    group: str | None
    resources: Mapping[str, int]
    required_traits: tuple[str, ...]
    forbidden_traits: tuple[str, ...]
    generation: int
    created_at: datetime
    updated_at: datetime
    # Why its last launch or migration failed, as its host said (kept once it runs).
    fault: str | None = None
    host_seq: int | None = None
    # The hosts that refused its launch, while it is being placed again (empty once it
    # runs, or once the launch was given up).
    tried_hosts: tuple[str, ...] = ()
    # The base image of its disk (None: blank, or no disk), and its NICs.
    image: str | None = None
    nics: tuple[Nic, ...] = ()
    # The size of its image when it has one, for a disk sized to it (no DISK_GB).
    image_bytes: int | None = None

    @property
    def disks(self) -> tuple[Disk, ...]:
        """Its disk, on whatever host it runs: made when it claims DISK_GB or names an
        image (then of the image's size when it claims no DISK_GB)."""
        size = disk_bytes(self.resources.get("DISK_GB"), self.image_bytes)
        if not size:
            return ()
        return (Disk(self.image, size, f"{POOL_NAME}/{volume_name(self.uuid)}"),)


@dataclass(frozen=True)
class Nic:
    network: str
    mac: str


@dataclass(frozen=True)
class Disk:
    """``volume``: POOL/VOLUME on its host."""

    image: str | None
    size_bytes: int
    volume: str


@dataclass(frozen=True)
class VmEvent:
    """One change of a VM's state, host or migration target, as the ledger committed it
    (``store.history``); ``fault``: the failure that caused it, if one did."""

    id: int
    at: datetime
    vm: str
    name: str
    old_state: str
    state: str
    old_host: str | None
    host: str | None
    old_target: str | None
    target: str | None
    fault: str | None


@dataclass(frozen=True)
class AllocationRecord:
    vm: str
    host: str
    resource_class: str
    amount: int
    state: str


@dataclass(frozen=True)
class ClassUsage:
    """One host's view of one class; ``free`` already counts pending as used."""

    capacity: int
    active: int
    pending: int

    @property
    def used(self) -> int:
        return self.active + self.pending

    @property
    def free(self) -> int:
        return self.capacity - self.used
