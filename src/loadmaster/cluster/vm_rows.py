"""What a placement reads of its VMs and their flavors, as plain records read with one Core
statement: the claim path reads and writes them without ORM entities (an entity costs
several times a row to load and to flush), and decodes each flavor's JSON once per call,
however many of its VMs the call places."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Text, bindparam, cast, select, update

from loadmaster.store import Prepared, run_chunked, run_many
from loadmaster.store.schema import FlavorRow, VmRow
from loadmaster.store.transaction import Transaction


@dataclass(frozen=True, slots=True)
class FlavorRules:
    id: int
    name: str
    resources: dict[str, int]
    required_traits: list[str]
    forbidden_traits: list[str]
    extra_specs: dict[str, str]
    class_traits: dict[str, list[str]]


@dataclass(slots=True)
class VmState:
    """A VM's row as a claim reads it and changes it; ``write_vms`` writes it back."""

    id: int
    uuid: str
    consumer_id: int
    flavor_id: int | None
    overrides: dict[str, int]
    state: str
    host_id: int | None
    target_host_id: int | None
    group_id: int | None
    generation: int
    host_seq: int | None
    updated_at: datetime
    # (state, host_id, target_host_id) as read: the VM's event says from what it moved.
    before: tuple[str, int | None, int | None] = field(init=False)

    def __post_init__(self) -> None:
        self.before = (self.state, self.host_id, self.target_host_id)


def vms_with_flavors(
    session: Transaction, uuids: Iterable[str], *, lock: bool
) -> tuple[dict[str, VmState], dict[int, FlavorRules]]:
    """The VMs by (canonical) uuid and their flavors by id, in one statement per chunk;
    ``lock``: the VM rows locked in id order (``store/locking.py``'s order: VMs first)."""
    found: dict[str, VmState] = {}
    flavors: dict[int, FlavorRules] = {}
    statement = _LOCK if lock else _READ
    for row in run_chunked(session, statement, "uuids", sorted(set(uuids))):
        id_, uuid, consumer_id, flavor_id, overrides, *rest = row[:_VM_WIDTH]
        vm = VmState(id_, uuid, consumer_id, flavor_id, _decoded(overrides), *rest)
        found[vm.uuid] = vm
        if vm.flavor_id is not None and vm.flavor_id not in flavors and row.f_name:
            flavors[vm.flavor_id] = _flavor(vm.flavor_id, row)
    return found, flavors


def write_vms(session: Transaction, vms: Iterable[VmState]) -> None:
    """The changed fields of ``vms`` written back, one executemany."""
    rows = [
        {
            "vm_id": vm.id,
            "new_state": vm.state,
            "new_host_id": vm.host_id,
            "new_target_host_id": vm.target_host_id,
            "new_generation": vm.generation,
            "new_host_seq": vm.host_seq,
            "new_updated_at": vm.updated_at,
        }
        for vm in vms
    ]
    run_many(session, _WRITE, rows)


def _decoded(overrides: str | None) -> dict[str, int]:
    # Most VMs override nothing: no decoder for them (a mass start reads 10,000 rows).
    return {} if overrides in (None, "{}") else json.loads(overrides)


def _flavor(flavor_id: int, row: Any) -> FlavorRules:
    return FlavorRules(
        flavor_id,
        row.f_name,
        json.loads(row.f_resources),
        json.loads(row.f_required),
        json.loads(row.f_forbidden),
        json.loads(row.f_extra),
        {} if row.f_class_traits in (None, "{}") else json.loads(row.f_class_traits),
    )


_VM_COLUMNS = (
    VmRow.id,
    VmRow.uuid,
    VmRow.consumer_id,
    VmRow.flavor_id,
    # As text, decoded by ``_decoded``.
    cast(VmRow.overrides, Text).label("overrides"),
    VmRow.state,
    VmRow.host_id,
    VmRow.target_host_id,
    VmRow.group_id,
    VmRow.generation,
    VmRow.host_seq,
    VmRow.updated_at,
)
_VM_WIDTH = len(_VM_COLUMNS)
# The flavor's JSON as text, decoded here once per flavor rather than once per VM row.
_READ_VMS = (
    select(
        *_VM_COLUMNS,
        FlavorRow.name.label("f_name"),
        cast(FlavorRow.resources, Text).label("f_resources"),
        cast(FlavorRow.required_traits, Text).label("f_required"),
        cast(FlavorRow.forbidden_traits, Text).label("f_forbidden"),
        cast(FlavorRow.extra_specs, Text).label("f_extra"),
        cast(FlavorRow.class_traits, Text).label("f_class_traits"),
    )
    .outerjoin(FlavorRow, FlavorRow.id == VmRow.flavor_id)
    .where(VmRow.uuid.in_(bindparam("uuids", expanding=True)))
    .order_by(VmRow.id)
)
_READ = Prepared(_READ_VMS)
_LOCK = Prepared(_READ_VMS.with_for_update(of=VmRow))
_VMS = VmRow.metadata.tables["vms"]
_WRITE = Prepared(
    update(_VMS)
    .where(_VMS.c.id == bindparam("vm_id"))
    .values(
        state=bindparam("new_state"),
        host_id=bindparam("new_host_id"),
        target_host_id=bindparam("new_target_host_id"),
        generation=bindparam("new_generation"),
        host_seq=bindparam("new_host_seq"),
        updated_at=bindparam("new_updated_at"),
    )
)
