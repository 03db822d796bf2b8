"""The VMs' history: a write transaction that changes a VM's state, host or migration
target adds one ``vm_events`` row per VM, in the same transaction, from what the VM was
when the transaction first touched it to what it is when it commits. Recorded by the
session rather than by each caller, so that no path that moves a VM (claims, activation,
failures, reconciliation, drains, whatever comes later) can forget to say so; one row per
transaction, so that the steps a transaction takes on its way (an activation swaps the
host before it changes the state) are not mistaken for changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import event, insert, inspect
from sqlalchemy.orm import Session, sessionmaker

from loadmaster.store.locking import now
from loadmaster.store.schema import HostRow, VmEventRow, VmRow

_WATCHED = ("state", "host_id", "target_host_id")
_CHANGES = "loadmaster_vm_changes"


@dataclass
class _Change:
    row: VmRow
    before: tuple[Any, ...]
    fault: str | None = None


def record_vm_events(sessions: sessionmaker[Session]) -> None:
    event.listen(sessions, "after_flush", _after_flush)
    event.listen(sessions, "before_commit", _before_commit)


def _after_flush(session: Session, _context: Any) -> None:
    # The attributes' history still holds what this flush wrote; it is reset after.
    changes: dict[int, _Change] = session.info.setdefault(_CHANGES, {})
    for obj in session.dirty:
        if not isinstance(obj, VmRow):
            continue
        attrs = inspect(obj).attrs
        histories = [attrs[key].history for key in _WATCHED]
        fault = attrs["fault"].history.added
        change = changes.get(obj.id)
        if change is None and any(h.added for h in histories):
            before = tuple(
                h.deleted[0] if h.deleted else h.unchanged[0] if h.unchanged else None
                for h in histories
            )
            change = changes[obj.id] = _Change(obj, before)
        if change is not None and fault:
            change.fault = fault[0]
        elif fault:
            # A failure is written before the VM's claim is released (a flush may come
            # between): it belongs to the change that follows in this transaction.
            changes[obj.id] = _Change(obj, (obj.state, obj.host_id, obj.target_host_id), fault[0])


def _before_commit(session: Session) -> None:
    session.flush()  # what is still unflushed is part of the account too
    changes: dict[int, _Change] = session.info.pop(_CHANGES, {})
    names: dict[int, str] = {}

    def name(host_id: int | None) -> str | None:
        if host_id is None:
            return None
        if host_id not in names:
            host = session.get(HostRow, host_id)
            names[host_id] = host.name if host is not None else str(host_id)
        return names[host_id]

    stamp = now()
    rows = []
    for vm_id, change in changes.items():
        row = change.row
        after = (row.state, row.host_id, row.target_host_id)
        if after == change.before:
            continue
        state, host, target = change.before
        rows.append(
            {
                "vm_id": vm_id,
                "at": stamp,
                "old_state": state,
                "state": row.state,
                "old_host": name(host),
                "host": name(row.host_id),
                "old_target": name(target),
                "target": name(row.target_host_id),
                "fault": change.fault,
            }
        )
    if rows:
        session.connection().execute(insert(VmEventRow), rows)
