"""The VMs' history: a write transaction that changes a VM's state, host or migration
target adds one ``vm_events`` row per VM, in the same transaction, from what the VM was
when the transaction first touched it to what it is when it commits. Recorded by the
session rather than by each caller, so that no path that moves a VM (claims, activation,
failures, reconciliation, drains, whatever comes later) can forget to say so; one row per
transaction, so that the steps a transaction takes on its way (an activation swaps the
host before it changes the state) are not mistaken for changes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import event, insert, inspect, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.util import identity_key

from loadmaster.store.driver import Prepared, run_many
from loadmaster.store.locking import execute_core, now
from loadmaster.store.schema import HostRow, VmEventRow, VmRow
from loadmaster.store.transaction import Transaction

_WATCHED = ("state", "host_id", "target_host_id")
_CHANGES = "loadmaster_vm_changes"
_NAMES = "loadmaster_host_names"


class _VmLike(Protocol):
    id: int
    state: str
    host_id: int | None
    target_host_id: int | None


@dataclass
class _Change:
    row: _VmLike  # its final values at commit
    before: tuple[Any, ...]
    fault: str | None = None


def note_written(
    session: Transaction,
    vms: Iterable[tuple[_VmLike, tuple[Any, ...]]],
    host_names: Mapping[int, str],
) -> None:
    """VMs changed by a Core statement, which the ORM does not see: ``(vm, before)`` with
    ``before`` its (state, host_id, target_host_id) as the transaction found it, and the
    names of the hosts the caller read (so that naming them at commit costs no query).
    Counted as the ORM's changes are: one event per VM per transaction."""
    changes: dict[int, _Change] = session.info.setdefault(_CHANGES, {})
    for vm, before in vms:
        change = changes.get(vm.id)
        if change is None:
            changes[vm.id] = _Change(vm, before)
        else:
            change.row = vm
    names: dict[int, str] = session.info.setdefault(_NAMES, {})
    for host_id, name in host_names.items():
        names.setdefault(host_id, name)


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
        if change is not None:
            change.row = obj  # the latest writer holds the values the VM commits with
        if change is None and any(h.added for h in histories):
            before = tuple(
                h.deleted[0] if h.deleted else h.unchanged[0] if h.unchanged else None
                for h in histories
            )
            change = changes[obj.id] = _Change(obj, before)
        elif change is None and fault:
            # A failure is written before the VM's claim is released (a flush may come
            # between): it belongs to the change that follows in this transaction.
            change = changes[obj.id] = _Change(obj, (obj.state, obj.host_id, obj.target_host_id))
        if change is None:
            continue
        if fault:
            change.fault = fault[0]
        _name_hosts(session, (*change.before[1:], obj.host_id, obj.target_host_id))


def _name_hosts(session: Session, host_ids: Iterable[int | None]) -> None:
    """Named now, from the hosts the transaction has loaded: once their generations are
    bumped they are expired, and naming them at commit would cost a query."""
    names: dict[int, str] = session.info.setdefault(_NAMES, {})
    for host_id in host_ids:
        if host_id is not None and host_id not in names:
            host = session.identity_map.get(identity_key(HostRow, host_id))
            name = inspect(host).dict.get("name") if host is not None else None
            if name is not None:
                names[host_id] = name


def _before_commit(session: Session) -> None:
    session.flush()  # what is still unflushed is part of the account too
    write_events(session)


def write_events(session: Transaction) -> None:
    """The events of the VMs the transaction changed, written before it commits (a
    ``Session``'s commit hook calls it; ``Store.transaction`` does itself)."""
    changes = {
        vm_id: change
        for vm_id, change in session.info.pop(_CHANGES, {}).items()
        if (change.row.state, change.row.host_id, change.row.target_host_id) != change.before
    }
    names: dict[int, str] = session.info.pop(_NAMES, {})
    if not changes:
        return
    ids = {
        h for c in changes.values() for h in (*c.before[1:], c.row.host_id, c.row.target_host_id)
    }
    missing = {h for h in ids if h is not None and h not in names}
    if missing:
        # Hosts the transaction never loaded (a stop, a migration's source): one query.
        query = select(HostRow.id, HostRow.name).where(HostRow.id.in_(missing))
        names.update((host_id, name) for host_id, name in execute_core(session, query))
    stamp = now()
    rows = []
    for vm_id, change in changes.items():
        row = change.row
        state, host, target = change.before
        rows.append(
            {
                "vm_id": vm_id,
                "at": stamp,
                "old_state": state,
                "state": row.state,
                "old_host": names.get(host) if host is not None else None,
                "host": names.get(row.host_id) if row.host_id is not None else None,
                "old_target": names.get(target) if target is not None else None,
                "target": names.get(row.target_host_id) if row.target_host_id is not None else None,
                "fault": change.fault,
            }
        )
    run_many(session, _INSERT_EVENTS, rows)


_INSERT_EVENTS = Prepared(insert(VmEventRow.metadata.tables["vm_events"]))
