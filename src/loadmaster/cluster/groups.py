"""Server groups: VMs that must (or should) share a host, or keep apart.

Nova's four policies; ``max_per_host`` caps how many members one host may hold (Nova's
``max_server_per_host``), which makes anti-affinity "at most N per host" instead of 1.
Membership is fixed when a VM is created (``VmSpec.group``), so the scheduler can count
members per host from the VM rows, pending ones included.
"""

from __future__ import annotations

import builtins
import uuid as uuidlib
from typing import Protocol

from sqlalchemy import select

from loadmaster.cluster import lookup
from loadmaster.cluster.records import GroupRecord, VmRecord
from loadmaster.cluster.vms import vm_records
from loadmaster.errors import Conflict, ValidationError
from loadmaster.store import Store
from loadmaster.store.schema import ServerGroupRow, VmRow

GROUP_POLICIES = ("affinity", "anti-affinity", "soft-affinity", "soft-anti-affinity")


def validate_policy(policy: object, field: str = "policy") -> str:
    if policy not in GROUP_POLICIES:
        raise ValidationError(
            f"{field} must be one of {', '.join(GROUP_POLICIES)}, got {policy!r}", field=field
        )
    assert isinstance(policy, str)
    return policy


class GroupFields(Protocol):
    """What a group record is made of: the entity, or a row of its columns."""

    @property
    def uuid(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def policy(self) -> str: ...
    @property
    def max_per_host(self) -> int | None: ...


def group_record(row: GroupFields) -> GroupRecord:
    return GroupRecord(row.uuid, row.name, row.policy, row.max_per_host)


class GroupService:
    def __init__(self, store: Store) -> None:
        self._store = store

    def create(self, name: str, policy: str, *, max_per_host: int | None = None) -> GroupRecord:
        if not isinstance(name, str) or not name.strip() or len(name) > 255:
            raise ValidationError(
                "name must be a non-empty string of at most 255 characters", field="name"
            )
        validate_policy(policy)
        if max_per_host is not None:
            if isinstance(max_per_host, bool) or not isinstance(max_per_host, int):
                raise ValidationError(
                    f"max_per_host must be an integer, got {max_per_host!r}", field="max_per_host"
                )
            if max_per_host < 1:
                raise ValidationError(
                    f"max_per_host must be at least 1, got {max_per_host}", field="max_per_host"
                )
            if policy == "affinity":
                raise ValidationError(
                    "max_per_host does not apply to affinity: all members share one host",
                    field="max_per_host",
                )
        with self._store.write() as session:
            taken = session.scalar(select(ServerGroupRow.id).where(ServerGroupRow.name == name))
            if taken is not None:
                raise Conflict(f"server group {name} already exists", field="name")
            row = ServerGroupRow(
                uuid=str(uuidlib.uuid4()), name=name, policy=policy, max_per_host=max_per_host
            )
            session.add(row)
            session.flush()
            return group_record(row)

    def get(self, ident: str) -> GroupRecord:
        """A group by uuid or name."""
        with self._store.read() as session:
            return group_record(lookup.group_row(session, ident))

    def list(self) -> builtins.list[GroupRecord]:
        with self._store.read() as session:
            rows = session.scalars(select(ServerGroupRow).order_by(ServerGroupRow.name))
            return [group_record(r) for r in rows]

    def members(self, ident: str) -> builtins.list[VmRecord]:
        """The group's VMs that are not deleted, oldest first."""
        with self._store.read() as session:
            row = lookup.group_row(session, ident)
            vms = session.scalars(
                select(VmRow)
                .where(VmRow.group_id == row.id, VmRow.state != "deleted")
                .order_by(VmRow.id)
            )
            return vm_records(session, list(vms))

    def delete(self, ident: str) -> None:
        """Refused while live VMs are members; deleted VMs merely let go of the group."""
        with self._store.write() as session:
            # The lock order of every writer: VM rows first (the deleted members this
            # unlinks; a retried VM delete holds one and then takes the group's key-share
            # lock), then the group row. Locked before counting, so a member being created
            # (its foreign key holds the group FOR KEY SHARE) commits first and is counted,
            # or waits and then fails.
            found = lookup.group_row(session, ident)
            session.execute(
                select(VmRow.id)
                .where(VmRow.group_id == found.id, VmRow.state == "deleted")
                .order_by(VmRow.id)
                .with_for_update()
            )
            row = lookup.group_row(session, ident, lock=True)
            live = lookup.live_vms_using(session, VmRow.group_id, row.id)
            if live:
                raise Conflict(
                    f"server group {row.name} still has {live} member VMs", field="group"
                )
            lookup.let_go_of(session, VmRow.group_id, row.id)
            session.delete(row)
