"""Maintenance drain: a host stops taking VMs and every VM on it is placed elsewhere.

The host goes to ``maintenance`` first (the scheduler's host_state filter and the ledger
both refuse it from then on), then all its VMs are placed in one best-effort scheduler
batch: running VMs become ``migrating`` (records on both hosts until the host agents
complete the move with ``activate`` or abort it by releasing the destination), VMs that
were only pending are re-placed in the claim's own transaction. The ledger checks the
server-group rules of every claim under the groups' row locks, so the batch cannot break
them against itself nor against placements running at the same time.

Draining again places what is left (a migration that aborted, a VM that fitted nowhere
before). The displayed status is computed, never stored: ``draining`` while a VM is on or
headed to a host in maintenance, ``maintenance`` once none is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.host_rows import silences
from loadmaster.cluster.hosts import HostService
from loadmaster.cluster.vms import PLACED_STATES
from loadmaster.errors import (
    ConcurrentUpdate,
    Conflict,
    InvalidTransition,
    LoadmasterError,
    ValidationError,
)
from loadmaster.pending import Ledger
from loadmaster.pending.waiting import WaitingClaims
from loadmaster.scheduler.core.request import RequestSpec
from loadmaster.scheduler.core.results import Explanation
from loadmaster.scheduler.scheduler import Scheduler
from loadmaster.store import Store
from loadmaster.store.locking import now
from loadmaster.store.schema import HostRow, VmRow

MAINTENANCE_RETRIES = 20


@dataclass(frozen=True)
class VmLeft:
    """A VM still on (or headed to) a host being drained."""

    vm: str
    name: str
    state: str
    host: str | None
    target_host: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "vm": self.vm,
            "name": self.name,
            "state": self.state,
            "host": self.host,
            "target_host": self.target_host,
        }


@dataclass(frozen=True)
class DrainStatus:
    """``warnings``: the host's agent cannot act (its VMs will not move until it is
    back), and the claims waiting on it."""

    host: str
    state: str
    vms_left: tuple[VmLeft, ...]
    warnings: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        if self.state == "maintenance" and self.vms_left:
            return "draining"
        return self.state

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "state": self.state,
            "status": self.status,
            "vms_left": len(self.vms_left),
            "migrating": sum(v.state == "migrating" for v in self.vms_left),
            "vms": [v.to_dict() for v in self.vms_left],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class Unplaced:
    """A VM the drain could not move, and why (the scheduler's explanation if no host
    fitted). ``stopped``: ``force`` stopped it instead."""

    vm: str
    error: LoadmasterError
    stopped: bool = False

    @property
    def explanation(self) -> Explanation | None:
        explanation = getattr(self.error, "explanation", None)
        return explanation if isinstance(explanation, Explanation) else None

    def to_dict(self) -> dict[str, object]:
        explanation = self.explanation
        return {
            "vm": self.vm,
            "reason": self.error.detail,
            "code": self.error.code,
            "explanation": None if explanation is None else explanation.to_dict(),
            "stopped": self.stopped,
        }


@dataclass(frozen=True)
class DrainResult:
    """``moved``: VM -> destination claimed by this call. ``in_flight``: migrations from or
    to the host already under way, which the agents have yet to finish or abort.
    ``seed``: the scheduling decision's, to replay it (None when nothing was placed).
    ``names``: VM uuid -> name, for every VM on the host when the drain began."""

    moved: dict[str, str]
    unplaced: tuple[Unplaced, ...]
    in_flight: tuple[str, ...]
    status: DrainStatus
    seconds: float = 0.0
    seed: int | None = None
    names: dict[str, str] = field(default_factory=dict)

    @property
    def stopped(self) -> list[str]:
        return [u.vm for u in self.unplaced if u.stopped]

    def to_dict(self) -> dict[str, object]:
        return {
            **self.status.to_dict(),
            "moved": dict(self.moved),
            "unplaced": [u.to_dict() for u in self.unplaced],
            "stopped": self.stopped,
            "in_flight": list(self.in_flight),
            "seconds": self.seconds,
            "seed": self.seed,
            "names": dict(self.names),
        }


class DrainService:
    """``lm.maintenance``: ``drain(host)`` and ``status(host)``."""

    def __init__(
        self, store: Store, scheduler: Scheduler, ledger: Ledger, waiting: WaitingClaims
    ) -> None:
        self._store = store
        self._scheduler = scheduler
        self._ledger = ledger
        self._waiting = waiting
        self._hosts = HostService(store)

    def status(self, host: str) -> DrainStatus:
        with self._store.read() as session:
            row = _root(session, host)
            left = _vms_left(session, row)
            warnings = []
            silent = silences(session, {row.id}, self._scheduler.agent_silent_after, now())
            if left and row.id in silent:
                warnings.append(
                    f"{silent[row.id].describe()}: nothing moves its VMs until it is back. "
                    f"If the host is down, evacuate it: loadmaster host evacuate {row.name} "
                    "--confirm-down"
                )
            warnings += [w.warning for w in self._waiting.find(host=row.name, session=session)]
            return DrainStatus(row.name, row.state, left, tuple(warnings))

    def drain(self, host: str, *, force: bool = False, policy: str | None = None) -> DrainResult:
        """Put ``host`` in maintenance and place every VM on it elsewhere, in one batch.

        ``force``: a VM that fits nowhere is stopped (its records go) so the host empties.
        Bad input (no such host, a child provider, a host that is down) changes nothing."""
        if not isinstance(force, bool):
            raise ValidationError("force must be true or false", field="force")
        name = self._enter_maintenance(host)
        before = self.status(name)
        in_flight = tuple(v.vm for v in before.vms_left if v.state == "migrating")
        movable = [v.vm for v in before.vms_left if v.state in ("running", "pending")]
        moved: dict[str, str] = {}
        unplaced: list[Unplaced] = []
        seconds = 0.0
        seed = None
        if movable:
            result = self._scheduler.schedule(
                [RequestSpec(vms=movable)], policy=policy, move_pending=True
            )
            seconds, seed = result.seconds, result.seed
            moved = result.placed
            failed = result.failed
            # A VM another drain (or a migrate call) moved meanwhile is not unplaced: it is
            # under way (in flight), or gone from here.
            now = self.status(name).vms_left
            stuck = {v.vm for v in now if v.state in ("running", "pending") and v.host == name}
            leaving = {v.vm for v in now if v.state == "migrating"}
            in_flight += tuple(p.vm for p in failed if p.vm in leaving)
            for placement in failed:
                if placement.vm not in stuck:
                    continue
                assert placement.error is not None
                stopped = force and self._stop(placement.vm, name)
                unplaced.append(Unplaced(placement.vm, placement.error, stopped))
        names = {v.vm: v.name for v in before.vms_left}
        return DrainResult(
            moved, tuple(unplaced), in_flight, self.status(name), seconds, seed, names
        )

    def _enter_maintenance(self, host: str) -> str:
        """From here on neither the scheduler nor the ledger puts anything new on the host.
        Claims and activations bump its generation meanwhile; the state change only needs
        the newest one, so a lost compare-and-swap is read again and retried."""
        for attempt in range(MAINTENANCE_RETRIES):
            with self._store.read() as session:
                row = _root(session, host)
                if row.state == "down":
                    raise Conflict(
                        f"host {row.name} is down: its VMs cannot be migrated away; bring it "
                        "up or stop them",
                        field="host",
                    )
                name, state, generation = row.name, row.state, row.generation
            if state == "maintenance":
                return name
            try:
                self._hosts.set_state(name, "maintenance", generation=generation)
                return name
            except ConcurrentUpdate:
                if attempt == MAINTENANCE_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _stop(self, vm: str, host: str) -> bool:
        """Stop a VM that cannot move. The ledger locks the VM row: if it began to migrate
        since it was read (another drain got a host for it), it is left to that migration."""
        try:
            self._ledger.stop(vm, if_on=host)
        except InvalidTransition:
            return False
        return True


def _root(session: Session, host: str) -> HostRow:
    return lookup.root_host_row(session, host, "drain its root host")


def _vms_left(session: Session, row: HostRow) -> tuple[VmLeft, ...]:
    """VMs on the host or headed to it (a migration that started before the drain: its
    agents finish it, and the next drain moves the VM on)."""
    vms = list(
        session.scalars(
            select(VmRow)
            .where(
                VmRow.state.in_(PLACED_STATES),
                or_(VmRow.host_id == row.id, VmRow.target_host_id == row.id),
            )
            .order_by(VmRow.id)
        )
    )
    ids = {v.host_id for v in vms} | {v.target_host_id for v in vms}
    names = dict(
        session.execute(
            select(HostRow.id, HostRow.name).where(HostRow.id.in_({i for i in ids if i}))
        ).all()
    )
    return tuple(
        VmLeft(
            v.uuid,
            v.name,
            v.state,
            names.get(v.host_id) if v.host_id else None,
            names.get(v.target_host_id) if v.target_host_id else None,
        )
        for v in vms
    )
