"""A claim's life after it is written: activation when the VM comes up, release, stop,
delete, and the failures a host reports. Each function runs in its caller's transaction
and keeps the VM's state and its records in step."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.records import VmRecord
from loadmaster.cluster.vms import TRANSITIONS, move, vm_records
from loadmaster.errors import Conflict, InvalidTransition, ValidationError
from loadmaster.pending.trees import reached_ids, tree_ids, with_roots
from loadmaster.store.locking import bump_consumers, generation_of, touch_generations
from loadmaster.store.schema import AllocationRow, HostRow, VmRow


@dataclass(frozen=True)
class FailOutcome:
    """``kind``: ``launch`` or ``migration`` when a claim ended, ``None`` when there was
    nothing left to undo."""

    vm: VmRecord
    kind: str | None


def activate(session: Session, vm: str, host: str | None = None) -> VmRecord:
    """The VM reported up: its pending records become active (a migration completes).

    ``host``: where the VM now runs, as its agent says. The claim must be there: an
    agent that launched a VM whose claim has meanwhile moved elsewhere (a drain
    re-placed it) must not activate the claim on another host."""
    row = lookup.vm_row(session, vm, lock=True)
    claimed = row.target_host_id if row.state == "migrating" else row.host_id
    if host is not None:
        where = lookup.host_row(session, host)
        if (where.root_id or where.id) != claimed:
            raise Conflict(
                f"VM {vm} is {row.state} and not claimed on {where.name}; it cannot come up there",
                field="host",
            )
    if row.state == "running":
        return vm_records(session, [row])[0]
    if row.state not in ("pending", "migrating"):
        raise InvalidTransition(
            f"VM {vm} is {row.state}; only a pending or migrating VM can start", field="vm"
        )
    activate_row(session, row)
    return vm_records(session, [row])[0]


def activate_row(session: Session, row: VmRow) -> None:
    rows = list(
        session.scalars(select(AllocationRow).where(AllocationRow.consumer_id == row.consumer_id))
    )
    touched = with_roots(session, {r.host_id for r in rows})
    if row.state == "migrating":
        # What it holds on storage both ends share stays: the guest's disk did not move.
        target_tree = tree_ids(session, row.target_host_id) | reached_ids(
            session, row.target_host_id
        )
        for r in rows:
            if r.host_id not in target_tree:
                session.delete(r)
        row.host_id, row.target_host_id = row.target_host_id, None
    session.execute(
        update(AllocationRow)
        .where(AllocationRow.consumer_id == row.consumer_id, AllocationRow.state == "pending")
        .values(state="active")
        .execution_options(synchronize_session=False)
    )
    move(row, "running")
    # The fault stays, as the last one the VM had (Nova keeps its instance faults too).
    row.tried_hosts = []
    session.flush()
    touch_generations(session, touched)
    bump_consumers(session, [row.consumer_id])
    row.host_seq = generation_of(session, row.host_id)


def release(session: Session, vm: str, host: str | None = None) -> int:
    """Remove the VM's records (on ``host`` only, if given). Releasing again is a no-op.

    Returns how many records were removed. The VM's state follows: a pending VM goes back
    to requested, an aborted migration back to running, a running VM with nothing left
    to stopped.
    """
    row = lookup.vm_row(session, vm, lock=True)
    host_row = lookup.host_row(session, host) if host is not None else None
    return release_row(session, row, host_row)


def release_row(
    session: Session, row: VmRow, host_row: HostRow | None, *, then: str | None = None
) -> int:
    """``then``: the state once nothing is left (by default: requested again for a VM
    that never started, stopped for one that ran)."""
    query = select(AllocationRow).where(AllocationRow.consumer_id == row.consumer_id)
    if host_row is not None:
        query = query.where(AllocationRow.host_id.in_(_held_on(session, row, host_row)))
    doomed = list(session.scalars(query))
    if not doomed:
        if host_row is None and row.state == "pending":
            # A pending VM holding no record at all (a VM whose overrides zeroed every
            # resource, from before such VMs were refused) is released all the same.
            move(row, then or "requested")
            row.host_id = row.target_host_id = None
        return 0
    left = list(
        session.scalars(
            select(AllocationRow).where(
                AllocationRow.consumer_id == row.consumer_id,
                AllocationRow.id.notin_([r.id for r in doomed]),
            )
        )
    )
    # The source's records, while the destination's are still pending. Read from what
    # goes and what stays, not from what stays alone: a disk on a sharing provider both
    # hosts reach stays active through the move.
    if (
        row.state == "migrating"
        and all(r.state == "active" for r in doomed)
        and any(r.state == "pending" for r in left)
    ):
        raise InvalidTransition(
            f"VM {row.uuid} is migrating; finish (activate) or abort (release the destination) first",
            field="host",
        )
    touched = with_roots(session, {r.host_id for r in doomed})
    if row.state == "migrating" and left and row.host_id is not None:
        # An aborted migration changes its source's work too (migrate_out -> run).
        touched.add(row.host_id)
    for r in doomed:
        session.delete(r)
    if not left:
        move(row, then or ("requested" if row.state == "pending" else "stopped"))
        row.host_id = row.target_host_id = row.host_seq = None
    elif row.state == "migrating":
        row.target_host_id = None
        move(row, "running")
    session.flush()
    touch_generations(session, touched)
    bump_consumers(session, [row.consumer_id])
    return len(doomed)


def _held_on(session: Session, row: VmRow, host_row: HostRow) -> set[int]:
    """The providers whose records of the VM end with its claim on ``host_row``: its
    tree, and, when the VM is there, the sharing providers it reaches that the VM's
    other host (of a migration) does not: those hold what the VM keeps."""
    root = host_row.root_id or host_row.id
    if root not in (row.host_id, row.target_host_id):
        return tree_ids(session, root)
    other = row.target_host_id if root == row.host_id else row.host_id
    shared = reached_ids(session, root)
    if row.state == "migrating" and shared:
        shared -= reached_ids(session, other)
    return tree_ids(session, root) | shared


def stop(session: Session, vm: str, *, if_on: str | None = None) -> VmRecord:
    """``if_on``: only a VM still running or pending on that host (a drain's force: a
    VM that began to migrate or moved meanwhile is left alone, InvalidTransition)."""
    row = lookup.vm_row(session, vm, lock=True)
    if if_on is not None:
        host = lookup.host_row(session, if_on)
        if row.state not in ("running", "pending") or row.host_id != host.id:
            raise InvalidTransition(
                f"VM {row.name} is no longer running or pending on {host.name}", field="vm"
            )
    if row.state == "stopped":
        return vm_records(session, [row])[0]
    if "stopped" not in TRANSITIONS[row.state]:
        raise InvalidTransition(f"VM {row.name} is {row.state} and cannot be stopped", field="vm")
    release_row(session, row, None, then="stopped")
    if row.state != "stopped":
        move(row, "stopped")
        row.host_id = row.target_host_id = None
    return vm_records(session, [row])[0]


def delete(session: Session, vm: str) -> VmRecord:
    row = lookup.vm_row(session, vm, lock=True)
    if row.state != "deleted":
        release_row(session, row, None)
        move(row, "deleted")
        row.host_id = row.target_host_id = None
    return vm_records(session, [row])[0]


def fail(session: Session, vm: str, host: str, reason: str) -> FailOutcome:
    """``host`` says it could not run ``vm``: a launch it refused or that failed, or a
    migration to or from it that failed. A launch gives the claim up (the VM is
    ``requested`` again, the host remembered in ``tried_hosts``); a migration rolls back
    (the destination's claim goes, the VM keeps running on the source). Either way the
    reason is kept on the VM. Saying it again, or about a claim that has already ended,
    changes nothing."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValidationError("reason must say why, in a non-empty string", field="reason")
    row = lookup.vm_row(session, vm, lock=True)
    host_row = lookup.host_row(session, host)
    root_id = host_row.root_id or host_row.id
    kind: str | None = None
    if row.state == "pending" and row.host_id == root_id:
        kind = "launch"
    elif row.state == "migrating" and root_id in (row.host_id, row.target_host_id):
        kind = "migration"
    if kind is None:
        return FailOutcome(vm_records(session, [row])[0], kind)
    # Set before the release, so that the VM's event (``store.history``) carries it.
    row.fault = f"{kind} on {host_row.name} failed: {reason.strip()[:2000]}"
    if kind == "launch":
        release_row(session, row, host_row)
        row.tried_hosts = [*row.tried_hosts, host_row.name]
    else:
        release_row(session, row, session.get(HostRow, row.target_host_id))
    return FailOutcome(vm_records(session, [row])[0], kind)


@dataclass(frozen=True)
class TakenOver:
    """What became of a migration with an end on a host down (``take_over_migration``):
    ``outcome`` ``aborted`` or ``landed``; ``dead_host`` the end that is down (the source
    when both are); ``landed_on`` the destination it now starts on."""

    outcome: str
    dead_host: str
    landed_on: str | None = None


def take_over_migration(session: Session, vm: str, down: Set[int]) -> TakenOver | None:
    """A migration with an end on a host known down (ids in ``down``) can be carried out
    by no agent: the dead end cannot, and the live end waits for it. None when the VM is
    no longer migrating to or from such a host.

    ``aborted``: the destination is down; the VM is back to running on its source (down
    too: it is then evacuated like any VM there). ``landed``: the source is down and the
    destination lives; its claim there becomes a launch, which its agent carries out (or
    just says up, when the guest already arrived). The fault says which host died."""
    row = lookup.vm_row(session, vm, lock=True)
    if row.state != "migrating" or not ({row.host_id, row.target_host_id} & down):
        return None
    source = session.get(HostRow, row.host_id)
    target = session.get(HostRow, row.target_host_id)
    assert source is not None and target is not None
    if target.id in down:
        row.fault = f"migration to {target.name} aborted: host {target.name} is down"
        release_row(session, row, target)
        return TakenOver("aborted", source.name if source.id in down else target.name)
    row.fault = (
        f"migration from {source.name} taken over: host {source.name} is down; "
        f"started again on {target.name}"
    )
    held = _held_on(session, row, source)
    doomed = [
        r
        for r in session.scalars(
            select(AllocationRow).where(AllocationRow.consumer_id == row.consumer_id)
        )
        if r.host_id in held
    ]
    touched = with_roots(session, {r.host_id for r in doomed}) | {source.id, target.id}
    for r in doomed:
        session.delete(r)
    row.host_id, row.target_host_id = target.id, None
    move(row, "pending")
    session.flush()
    touch_generations(session, touched)
    bump_consumers(session, [row.consumer_id])
    row.host_seq = generation_of(session, target.id)
    return TakenOver("landed", source.name, target.name)
