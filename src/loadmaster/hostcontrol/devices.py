"""Host devices as the operator sees them: each device provider of a host (a PF, a GPU)
with what is used of it and which VMs hold it, and the particular devices (PCI address,
mediated device) each VM's agent gave it.

The ledger counts devices per provider; which device a VM holds is the agent's choice,
said when the VM comes up (``given``). What an agent said is shown only while the VM
still holds records on that provider, so a VM that stopped or moved shows none of it
without anything having to clear it.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.records import VmRecord
from loadmaster.errors import Conflict, ValidationError
from loadmaster.pending import lifecycle
from loadmaster.resources.tree_fit import NODE_CLASSES
from loadmaster.store import Store
from loadmaster.store.schema import (
    AllocationRow,
    HostRow,
    HostTraitRow,
    InventoryRow,
    ResourceClassRow,
    TraitRow,
    VmDeviceRow,
    VmRow,
)

_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
MAX_DEVICES = 64


@dataclass(frozen=True)
class GivenDevice:
    provider: str
    address: str
    mdev_uuid: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"provider": self.provider, "address": self.address, "mdev_uuid": self.mdev_uuid}


@dataclass(frozen=True)
class Holder:
    vm: str
    name: str
    amount: int
    state: str  # pending or active
    devices: tuple[GivenDevice, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "vm": self.vm,
            "name": self.name,
            "amount": self.amount,
            "state": self.state,
            "devices": [d.to_dict() for d in self.devices],
        }


@dataclass(frozen=True)
class DeviceProviderView:
    provider: str
    parent: str
    resource_class: str
    total: int
    used: int
    traits: tuple[str, ...]
    holders: tuple[Holder, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "parent": self.parent,
            "resource_class": self.resource_class,
            "total": self.total,
            "used": self.used,
            "traits": list(self.traits),
            "holders": [h.to_dict() for h in self.holders],
        }


def parse_given(raw: Sequence[Mapping[str, object]]) -> list[GivenDevice]:
    """An agent's list of devices given; an error names the entry and field."""
    if len(raw) > MAX_DEVICES:
        raise ValidationError(f"devices: at most {MAX_DEVICES}", field="devices")
    out = []
    for i, entry in enumerate(raw):
        at = f"devices[{i}]"
        provider, address, mdev = (
            entry.get("provider"),
            entry.get("address"),
            entry.get("mdev_uuid"),
        )
        if not isinstance(provider, str) or not provider:
            raise ValidationError(f"{at}.provider must be a provider name", field=f"{at}.provider")
        if not isinstance(address, str) or not _ADDRESS.match(address):
            raise ValidationError(
                f"{at}.address must be a PCI address (0000:3b:02.0), got {address!r}",
                field=f"{at}.address",
            )
        mdev_uuid = None
        if mdev is not None:
            try:
                mdev_uuid = str(uuidlib.UUID(str(mdev)))
            except ValueError:
                raise ValidationError(
                    f"{at}.mdev_uuid must be a uuid, got {mdev!r}", field=f"{at}.mdev_uuid"
                ) from None
        out.append(GivenDevice(provider, address, mdev_uuid))
    return out


class DeviceViews:
    def __init__(self, store: Store) -> None:
        self._store = store

    def up(self, vm: str, host: str, devices: Sequence[GivenDevice]) -> VmRecord:
        """The VM runs on ``host`` with ``devices``: activated and its devices recorded in
        one transaction, so no reader sees it running without the devices it holds, and a
        device its claim does not hold refuses the whole, the VM left as it was."""
        with self._store.write() as session:
            record = lifecycle.activate(session, vm, host)
            _write_given(session, vm, host, devices)
            return record

    def of_vm(self, vm: str) -> list[GivenDevice]:
        """The devices the VM holds now, as its agent said."""
        with self._store.read() as session:
            row = lookup.vm_row(session, vm)
            return [d for devices in _given(session, [row.id]).values() for d in devices]

    def of_host(self, host: str) -> list[DeviceProviderView]:
        """The host's device providers (its children that are not NUMA nodes), each with
        its class, traits, usage and holders."""
        with self._store.read() as session:
            root = lookup.host_row(session, host)
            providers = session.execute(
                select(HostRow.id, HostRow.name, HostRow.parent_id)
                .where(HostRow.root_id == root.id, HostRow.id != root.id)
                .order_by(HostRow.name)
            ).all()
            ids = [p.id for p in providers]
            names = {p.id: p.name for p in providers} | {root.id: root.name}
            inventories: dict[int, list[tuple[str, int]]] = {}
            for host_id, name, total in session.execute(
                select(InventoryRow.host_id, ResourceClassRow.name, InventoryRow.total)
                .join(ResourceClassRow)
                .where(InventoryRow.host_id.in_(ids))
            ):
                inventories.setdefault(host_id, []).append((name, int(total)))
            traits: dict[int, list[str]] = {}
            for host_id, name in session.execute(
                select(HostTraitRow.host_id, TraitRow.name)
                .join(TraitRow)
                .where(HostTraitRow.host_id.in_(ids))
                .order_by(TraitRow.name)
            ):
                traits.setdefault(host_id, []).append(name)
            holders: dict[tuple[int, str], list[tuple[int, str, str, int, str]]] = {}
            for host_id, class_name, vm_id, uuid, name, amount, state in session.execute(
                select(
                    AllocationRow.host_id,
                    ResourceClassRow.name,
                    VmRow.id,
                    VmRow.uuid,
                    VmRow.name,
                    AllocationRow.amount,
                    AllocationRow.state,
                )
                .join(VmRow, VmRow.consumer_id == AllocationRow.consumer_id)
                .join(ResourceClassRow, ResourceClassRow.id == AllocationRow.resource_class_id)
                .where(AllocationRow.host_id.in_(ids))
                .order_by(VmRow.name)
            ):
                holders.setdefault((host_id, class_name), []).append(
                    (vm_id, uuid, name, int(amount), state)
                )
            given = _given(session, [h[0] for hs in holders.values() for h in hs])
            out = []
            for p in providers:
                offered = inventories.get(p.id, [])
                if any(name in NODE_CLASSES for name, _ in offered):
                    continue  # a NUMA node
                # Mostly one class; two while a class that changed is still in use.
                for resource_class, total in sorted(offered):
                    taken = holders.get((p.id, resource_class), [])
                    out.append(
                        DeviceProviderView(
                            provider=p.name,
                            parent=names.get(p.parent_id, root.name),
                            resource_class=resource_class,
                            total=total,
                            used=sum(h[3] for h in taken),
                            traits=tuple(traits.get(p.id, ())),
                            holders=tuple(
                                Holder(
                                    uuid,
                                    name,
                                    amount,
                                    state,
                                    tuple(d for d in given.get(vm_id, ()) if d.provider == p.name),
                                )
                                for vm_id, uuid, name, amount, state in taken
                            ),
                        )
                    )
            return out


def _held(
    session: Session, row: VmRow, host: str, devices: Sequence[GivenDevice]
) -> dict[str, int]:
    """The providers under ``host`` the VM holds records on, by name; a device on any
    other is refused naming it."""
    root = lookup.host_row(session, host)
    held = dict(
        session.execute(
            select(HostRow.name, HostRow.id)
            .join(AllocationRow, AllocationRow.host_id == HostRow.id)
            .where(AllocationRow.consumer_id == row.consumer_id, HostRow.root_id == root.id)
        ).all()
    )
    for i, device in enumerate(devices):
        if device.provider not in held:
            raise Conflict(
                f"devices[{i}].provider: VM {row.uuid} holds nothing of {device.provider} "
                f"on host {root.name}",
                field=f"devices[{i}].provider",
            )
    return held


def _given(session: Session, vm_ids: Sequence[int]) -> dict[int, list[GivenDevice]]:
    """Per VM, the devices its agent said it gave it, on providers it still holds records
    on."""
    if not vm_ids:
        return {}
    query = (
        select(VmDeviceRow.vm_id, HostRow.name, VmDeviceRow.address, VmDeviceRow.mdev_uuid)
        .join(HostRow, HostRow.id == VmDeviceRow.provider_id)
        .join(VmRow, VmRow.id == VmDeviceRow.vm_id)
        .where(
            VmDeviceRow.vm_id.in_(set(vm_ids)),
            select(AllocationRow.id)
            .where(
                AllocationRow.consumer_id == VmRow.consumer_id,
                AllocationRow.host_id == VmDeviceRow.provider_id,
            )
            .exists(),
        )
        .order_by(VmDeviceRow.id)
    )
    out: dict[int, list[GivenDevice]] = {}
    for vm_id, provider, address, mdev in session.execute(query):
        out.setdefault(vm_id, []).append(GivenDevice(provider, address, mdev))
    return out


def _write_given(session: Session, vm: str, host: str, devices: Sequence[GivenDevice]) -> None:
    row = lookup.vm_row(session, vm, lock=True)
    held = _held(session, row, host, devices)
    session.execute(delete(VmDeviceRow).where(VmDeviceRow.vm_id == row.id))
    session.add_all(
        VmDeviceRow(
            vm_id=row.id,
            provider_id=held[d.provider],
            address=d.address,
            mdev_uuid=d.mdev_uuid,
        )
        for d in devices
    )
