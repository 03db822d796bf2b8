"""Reconciliation: the ledger aligned with what a host reports running, by the host's own
sequence of what it had seen (no clocks compared), or by the server's clock for reports
that carry only a time."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.errors import ValidationError
from loadmaster.pending.lifecycle import activate_row, release_row
from loadmaster.pending.trees import tree_ids
from loadmaster.store.locking import generation_of, iso_utc, now
from loadmaster.store.schema import AllocationRow, HostAgentRow, HostReportRow, HostRow, VmRow


@dataclass(frozen=True)
class ReconcileResult:
    activated: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    # The root host's generation once the reconciliation commits.
    generation: int = 0
    # Why each released or stopped VM ended (VM uuid, reason), as its fault says.
    reasons: tuple[tuple[str, str], ...] = ()


def reconcile(
    session: Session,
    host: str,
    present: Iterable[str],
    *,
    as_of: datetime | None = None,
    seen_generation: int | None = None,
    launching: Iterable[str] = (),
    dry_run: bool = False,
) -> ReconcileResult:
    """Align the records with what the host reports running (``dry_run``: say what that
    would do, in a read transaction, changing nothing).

    A pending VM that is there has started (activate). A VM the report may speak for and
    that is neither there nor ``launching`` has ended: a pending one never started
    (release: it may be placed again), a running one has stopped. The report may speak
    for a VM only if the host listed its VMs after learning of it:

    - with ``seen_generation`` (the host generation of the last work list the host's
      agent read before listing its VMs): the VM's claim or activation there stamped the
      host at that generation or before (``host_seq``). No clock is compared, so a slow
      launch keeps its claim for as long as its agent says it is launching.
    - otherwise, by the server's clock, ``as_of`` (when the host listed its VMs): records
      newer than it, and VMs that came up since, are left alone.

    A migration in flight is left to whoever runs it (``activate`` completes it,
    releasing the destination aborts it): the destination lists the VM only once it has
    switched over, so a report cannot tell a migration still copying from one that
    failed. Nothing here runs on a timer.
    """
    seen = {lookup.canonical_uuid(u) for u in present}
    busy = {lookup.canonical_uuid(u) for u in launching}
    root, verdicts, unexpected = _judge(
        session, host, seen, busy, as_of, seen_generation, lock=not dry_run
    )
    if not dry_run and seen_generation is not None:
        _keep_report(session, root, seen | busy, seen_generation)
    activated: list[str] = []
    ended: dict[str, list[str]] = {"release": [], "stop": []}
    reasons: list[tuple[str, str]] = []
    for vm, verdict in verdicts:
        if verdict == "activate":
            if not dry_run:
                activate_row(session, vm)
            activated.append(vm.uuid)
            continue
        reason = (
            f"host {root.name} reported it neither running nor launching"
            if verdict == "release"
            else f"host {root.name} reported it not running: its agent lists no such guest"
        )
        if not dry_run:
            # Set before the release, so that the VM's event (``store.history``) carries it.
            vm.fault = reason
            release_row(session, vm, root)
        ended[verdict].append(vm.uuid)
        reasons.append((vm.uuid, reason))
    return ReconcileResult(
        tuple(activated),
        tuple(ended["release"]),
        tuple(ended["stop"]),
        tuple(unexpected),
        generation_of(session, root.id),
        tuple(reasons),
    )


def _keep_report(session: Session, root: HostRow, listed: set[str], seen: int) -> None:
    """What the host's agent listed (running or launching: both are spared alike) and the
    generation it had seen then, for the audit (``audit.world_problems``). Kept with the
    reconciliation it led to, so that the audit finds only what the ledger came to believe
    since, behind the reports' back. Written before the hosts' generations move: the rows
    are taken in the lock order's place."""
    agent = session.get(HostAgentRow, root.id)
    if agent is None:
        return  # reported on by hand: no agent whose word to keep
    agent.seen_generation = seen
    vms = sorted(listed)
    report = session.get(HostReportRow, root.id)
    if report is None:
        # No measurements yet: none are made up, the scheduler reads an empty load as none.
        session.add(
            HostReportRow(host_id=root.id, reported_at=now(), usage={}, load={}, running_vms=vms)
        )
    else:
        report.running_vms = vms


def _judge(
    session: Session,
    host: str,
    seen: set[str],
    busy: set[str],
    as_of: datetime | None,
    seen_generation: int | None,
    *,
    lock: bool,
) -> tuple[HostRow, list[tuple[VmRow, str]], list[str]]:
    """The host, what becomes of each of its VMs the report decides (``activate``,
    ``release`` or ``stop``), and the VMs it runs that the ledger does not put there."""
    # By sequence the clock plays no part, so a host's skewed clock is no error.
    as_of = now() if seen_generation is not None else check_as_of(as_of)

    def known(vm: VmRow, since: datetime) -> bool:
        if seen_generation is not None:
            # Every claim moves its host past generation 0; a VM claimed before
            # stamps existed counts as claimed at 1.
            return (vm.host_seq or 1) <= seen_generation
        return since <= as_of

    root = lookup.host_row(session, host)
    if seen_generation is not None and seen_generation > root.generation:
        # A report may only claim to know what the server has said: one beyond would let
        # it end claims its agent never saw.
        raise ValidationError(
            f"seen_generation {seen_generation} is beyond host {root.name}'s generation "
            f"({root.generation}): a report may only say it saw a work list the server gave",
            field="seen_generation",
        )
    tree = tree_ids(session, root.root_id or root.id)
    # Lock the VMs first, then read their records: an activation or a claim that
    # committed while we waited is seen, not overwritten with what it replaced.
    here = select(AllocationRow.consumer_id).where(AllocationRow.host_id.in_(tree))
    query = select(VmRow).where(VmRow.consumer_id.in_(here)).order_by(VmRow.id)
    vms = session.scalars(query.with_for_update() if lock else query).all()
    if lock:
        lookup.share_groups(session, vms)
    by_vm: dict[int, tuple[VmRow, list[AllocationRow]]] = {v.consumer_id: (v, []) for v in vms}
    for alloc in session.scalars(
        select(AllocationRow).where(
            AllocationRow.host_id.in_(tree), AllocationRow.consumer_id.in_(by_vm)
        )
    ):
        by_vm[alloc.consumer_id][1].append(alloc)
    verdicts: list[tuple[VmRow, str]] = []
    for vm, allocs in by_vm.values():
        if not allocs or vm.state == "migrating":
            continue  # left this host meanwhile, or a migration (its executor's)
        pending_here = [a for a in allocs if a.state == "pending"]
        if vm.uuid in seen:
            if pending_here:
                verdicts.append((vm, "activate"))
        elif vm.uuid in busy:
            continue
        elif pending_here:
            if known(vm, max(a.created_at for a in pending_here)):
                verdicts.append((vm, "release"))
        elif vm.state == "running" and known(vm, vm.updated_at):
            # Only a VM already running here when the host listed its VMs is proven
            # gone; one that came up (or finished migrating here) since is spared.
            verdicts.append((vm, "stop"))
    unexpected = sorted(seen - {vm.uuid for vm, _ in by_vm.values()})
    return root, verdicts, unexpected


# How far a report's ``as_of`` may stray from the server's clock. A report from the future
# would release claims made after it; one older than a day describes a host that has long
# moved on. Both are refused, before anything is stored.
AS_OF_FUTURE = timedelta(minutes=5)
AS_OF_PAST = timedelta(days=1)


def check_as_of(as_of: datetime | None) -> datetime:
    """``as_of`` as naive UTC (a time without a zone is taken to be UTC already) if the
    server's clock allows it; now if None."""
    current = now()
    if as_of is None:
        return current
    if as_of.tzinfo is not None:
        try:
            as_of = as_of.astimezone(UTC).replace(tzinfo=None)
        except OverflowError:
            raise ValidationError(
                f"as_of {as_of.isoformat()} is outside the range of dates", field="as_of"
            ) from None
    if as_of > current + AS_OF_FUTURE or as_of < current - AS_OF_PAST:
        raise ValidationError(
            f"as_of {iso_utc(as_of)} is more than {AS_OF_FUTURE} ahead of or "
            f"{AS_OF_PAST} behind the server's clock ({iso_utc(current)})",
            field="as_of",
        )
    return as_of
