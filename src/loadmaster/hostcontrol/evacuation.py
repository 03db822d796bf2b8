"""Evacuation: the VMs of a host that is down are placed elsewhere and started there.

A host is *known* down once it is fenced (the configured fence command, run with the
host's name, exits 0: oVirt fences through power management before it restarts highly
available VMs) or once the operator confirms it (``host evacuate HOST --confirm-down``).
Only then does the host go to state ``down`` and do its claims end: each VM's records
there go in the same transaction as its claim on the new host (the ledger's ``evacuate``
intent), so a VM is never on no host, and a VM that fits nowhere keeps its claim on the
dead host (shown there, placed by the next evacuation). Without fencing or confirmation
nothing changes: a host that is only silent may still run its VMs.

Placement is the scheduler's, with every filter, group rule and pending claim: VMs tagged
``ha`` first, then by priority. Evacuating again places what is left; a VM already
evacuated is refused by the ledger under its row lock, so evacuations running side by
side (several server processes) never place a VM twice.

``AutoEvacuation`` runs in the server process when a fence command is configured: each
pass, a host whose agent has been silent past ``agent_silent_after`` is fenced by one
process (a compare-and-swap on ``host_agents.fence_claimed_at``, once per silence; a
fence that failed is tried again after another threshold plus the fence's timeout), and
the VMs of every host fenced in the pass are placed together. No host is fenced while
more than half of the agents are silent, nor before the process has listened for a
threshold. A host that comes back stays ``down`` until the operator sets it ``up``; its
agent stops what the ledger moved away, since its work list no longer holds it.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.hosts import HostService
from loadmaster.errors import (
    ConcurrentUpdate,
    Conflict,
    FenceFailed,
    LoadmasterError,
    ValidationError,
)
from loadmaster.hostcontrol.service import HostControl
from loadmaster.hostcontrol.watch import DEFAULT_FLUSH_S, DEFAULT_REFRESH_S
from loadmaster.scheduler.drain import Unplaced
from loadmaster.scheduler.request import RequestSpec
from loadmaster.scheduler.scheduler import Scheduler
from loadmaster.store import Store
from loadmaster.store.locking import lock_vms, now
from loadmaster.store.schema import HostAgentRow, HostRow, VmRow
from loadmaster.tiers import priority_of

log = logging.getLogger(__name__)

HA_TAG = "ha"
# How a host was known down (``EvacuationResult.known_down``), in its VMs' faults.
KNOWN_DOWN = {"fenced": "down (fenced)", "confirmed": "down (confirmed)", "already": "down"}
DEFAULT_FENCE_TIMEOUT_S = 60.0
STATE_RETRIES = 20
# More silent agents than this share of the hosts up: no host is fenced (see ``due``).
MAX_SILENT_SHARE = 0.5


@dataclass(frozen=True)
class EvacuationResult:
    """``known_down``: how the host was known down (``fenced``, ``confirmed``, or
    ``already`` when it was down before this call). ``order``: the VMs in the order they
    were placed (highly available ones first). ``in_flight``: migrations from or to the
    host, left to the agent that runs them (its rollback leaves the VM for the next
    evacuation). ``names``: VM uuid -> name."""

    host: str
    known_down: str
    moved: dict[str, str]
    unplaced: tuple[Unplaced, ...]
    in_flight: tuple[str, ...]
    order: tuple[str, ...]
    seconds: float
    names: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "known_down": self.known_down,
            "moved": dict(self.moved),
            "unplaced": [u.to_dict() for u in self.unplaced],
            "in_flight": list(self.in_flight),
            "order": list(self.order),
            "seconds": self.seconds,
            "names": dict(self.names),
        }


class EvacuationService:
    """``lm.evacuation``: ``evacuate(host, confirm_down=)``, and ``fence(host)``.

    ``fence_command``: argv the host's name is appended to (None: no fencing). The silence
    threshold is the host agents' (``HostControl.silent_after``), read at each call."""

    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        control: HostControl,
        *,
        fence_command: Sequence[str] | None = None,
        fence_timeout_s: float = DEFAULT_FENCE_TIMEOUT_S,
    ) -> None:
        self._store = store
        self._scheduler = scheduler
        self._control = control
        self._hosts = HostService(store)
        self.fence_command = tuple(fence_command) if fence_command else None
        self.fence_timeout_s = fence_timeout_s

    @property
    def silent_after(self) -> timedelta:
        return self._control.silent_after

    def evacuate(
        self, host: str, *, confirm_down: bool = False, policy: str | None = None
    ) -> EvacuationResult:
        """Know ``host`` down (it is already, the operator confirms it, or the fence
        command succeeds), then place its VMs elsewhere. Refused, changing nothing, while
        its agent is heard from, or when the host is neither confirmed down nor fenced."""
        if not isinstance(confirm_down, bool):
            raise ValidationError("confirm_down must be true or false", field="confirm_down")
        started = time.perf_counter()
        name, known = self._know_down(host, confirm_down)
        return self._place({name: known}, policy, started)[0]

    def _know_down(self, host: str, confirm_down: bool) -> tuple[str, str]:
        """The host's name once it is down, and how it is known to be (see
        ``EvacuationResult.known_down``)."""
        with self._store.read() as session:
            row = _root(session, host)
            name, state = row.name, row.state
            heard = _heard_ago(session, row.id)
        if state == "down":
            return name, "already"
        if heard is not None and heard <= self.silent_after:
            raise Conflict(
                f"host {name}'s agent was heard {heard.total_seconds():.0f} s ago: a host "
                f"that answers is drained (loadmaster host drain {name}), not evacuated",
                field="host",
            )
        if confirm_down:
            known = "confirmed"
        elif self.fence_command is not None:
            self.fence(name)
            known = "fenced"
        else:
            raise Conflict(
                f"host {name} is not known to be down, and its VMs may still run there: "
                f"make sure it is off, then run loadmaster host evacuate {name} "
                "--confirm-down (or configure LOADMASTER_FENCE_COMMAND); nothing changed",
                field="confirm_down",
            )
        self._mark_down(name)
        log.warning("host %s is down (%s): evacuating its VMs", name, known)
        return name, known

    def fence(self, host: str) -> None:
        """Run the fence command with the host's name; FenceFailed unless it exits 0."""
        if self.fence_command is None:
            raise Conflict("no fence command is configured", field="host")
        argv = [*self.fence_command, host]
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.fence_timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            why = f"did not finish within {self.fence_timeout_s:g} s"
        except OSError as exc:
            why = f"could not run: {exc}"
        else:
            if done.returncode == 0:
                log.warning("host %s fenced (%s)", host, shlex.join(argv))
                return
            said = (done.stderr or done.stdout).strip().splitlines()
            why = f"exited {done.returncode}" + (f": {said[-1][:500]}" if said else "")
        log.error("fencing host %s failed: %s %s", host, shlex.join(argv), why)
        raise FenceFailed(
            f"fence command {shlex.join(argv)} {why}; host {host} is not known to be down "
            "and its claims are kept",
            field="host",
        )

    def _mark_down(self, name: str) -> None:
        # Claims and reports bump the generation meanwhile; only the state matters here.
        for attempt in range(STATE_RETRIES):
            with self._store.read() as session:
                row = _root(session, name)
                if row.state == "down":
                    return
                generation = row.generation
            try:
                self._hosts.set_state(name, "down", generation=generation)
                return
            except ConcurrentUpdate:
                if attempt == STATE_RETRIES - 1:
                    raise

    def _say_why(
        self, vms: Sequence[VmRow], origin: Mapping[str, str | None], known: Mapping[str, str]
    ) -> None:
        """Each VM's fault says that its host is down, before the evacuation moves it: the
        move is the host's doing. Written once per host going down, so a VM that fits
        nowhere costs no write at each pass (nor loses how its host was known down)."""
        why = {}
        for vm in vms:
            host = origin[vm.uuid]
            if host is not None and not (vm.fault or "").startswith(f"host {host} is down"):
                why[vm.uuid] = f"host {host} is {KNOWN_DOWN[known[host]]}: evacuated"
        if not why:
            return
        with self._store.write() as session:
            for uuid, row in lock_vms(session, why).items():
                row.fault = why[uuid]

    def _place(
        self, known: Mapping[str, str], policy: str | None, started: float
    ) -> list[EvacuationResult]:
        """Place the VMs of the hosts ``known`` down (name -> how) in one scheduler batch
        per wave, however many hosts died together; a result per host."""
        with self._store.read() as session:
            ids = {_root(session, name).id: name for name in known}
            vms = list(
                session.scalars(
                    select(VmRow)
                    .where(
                        VmRow.state.in_(("running", "pending", "migrating")),
                        or_(VmRow.host_id.in_(ids), VmRow.target_host_id.in_(ids)),
                    )
                    .order_by(VmRow.id)
                )
            )
        # Which dead host each VM is on, or headed to (a migration in flight).
        origin = {v.uuid: ids.get(v.host_id or 0) or ids.get(v.target_host_id or 0) for v in vms}
        staying = sorted(
            (v for v in vms if v.state != "migrating"),
            key=lambda v: (HA_TAG not in v.tags, -priority_of(v.tags), v.name, v.uuid),
        )
        self._say_why(staying, origin, known)
        # Two calls, not one batch: short of room, the highly available VMs get it.
        waves = [
            [v.uuid for v in staying if HA_TAG in v.tags],
            [v.uuid for v in staying if HA_TAG not in v.tags],
        ]
        moved: dict[str, str] = {}
        unplaced: list[Unplaced] = []
        for wave in waves:
            if not wave:
                continue
            result = self._scheduler.schedule(
                [RequestSpec(vms=wave)], policy=policy, move_pending=True, intent="evacuate"
            )
            moved.update(result.placed)
            for placement in result.failed:
                assert placement.error is not None
                unplaced.append(Unplaced(placement.vm, placement.error))
        seconds = time.perf_counter() - started
        if staying:
            log.warning(
                "host(s) %s: %d VMs evacuated in %.3f s, %d left",
                ", ".join(known),
                len(moved),
                seconds,
                len(unplaced),
            )
        return [
            EvacuationResult(
                name,
                how,
                {vm: host for vm, host in moved.items() if origin[vm] == name},
                tuple(u for u in unplaced if origin[u.vm] == name),
                tuple(v.uuid for v in vms if v.state == "migrating" and origin[v.uuid] == name),
                tuple(v.uuid for v in staying if origin[v.uuid] == name),
                seconds,
                {v.uuid: v.name for v in vms if origin[v.uuid] == name},
            )
            for name, how in known.items()
        ]

    # -- the automatic pass ----------------------------------------------------------------
    def due(self, heard_since: datetime | None = None) -> tuple[list[str], list[str]]:
        """Hosts whose agent is silent past the threshold: (not yet down, to fence; down
        with VMs still claimed there, to evacuate again). None to fence when more than
        ``MAX_SILENT_SHARE`` of the hosts up with an agent are silent: as oVirt's fencing
        policy skips fencing on cluster connectivity issues, so many silences at once say
        more about this server (its network, its load) than about the hosts.
        ``heard_since``: only hosts whose agent was heard at or after it are fenced."""
        cutoff = now() - self.silent_after
        with self._store.read() as session:
            agents = session.execute(
                select(HostRow.id, HostRow.name, HostRow.state, HostAgentRow.last_seen_at)
                .join(HostAgentRow, HostAgentRow.host_id == HostRow.id)
                .where(HostRow.parent_id.is_(None))
                .order_by(HostRow.id)
            ).all()
            silent = [(i, name, state) for i, name, state, seen in agents if seen < cutoff]
            down = [i for i, _, state in silent if state == "down"]
            left = set(
                session.scalars(
                    select(VmRow.host_id).where(
                        VmRow.host_id.in_(down), VmRow.state.in_(("running", "pending"))
                    )
                )
            )
        to_fence = [
            name
            for _, name, state, seen in agents
            if seen < cutoff and state != "down" and (heard_since is None or seen >= heard_since)
        ]
        watched = sum(state != "down" for _, _, state, _ in agents)
        if len(to_fence) > MAX_SILENT_SHARE * watched:
            log.warning(
                "%d of %d hosts' agents are silent: more likely this server's trouble than "
                "that many dead hosts; none fenced",
                len(to_fence),
                watched,
            )
            to_fence = []
        return to_fence, [name for i, name, _ in silent if i in left]

    def claim_fence(self, host: str) -> bool:
        """Whether this process fences ``host`` now: it still is silent and no process has
        taken it on since its agent was last heard (or that one's try is long over)."""
        current = now()
        retry = self.silent_after + timedelta(seconds=self.fence_timeout_s)
        with self._store.write() as session:
            row = _root(session, host)
            claimed = session.execute(
                update(HostAgentRow)
                .where(
                    HostAgentRow.host_id == row.id,
                    HostAgentRow.last_seen_at < current - self.silent_after,
                    or_(
                        HostAgentRow.fence_claimed_at.is_(None),
                        HostAgentRow.fence_claimed_at < HostAgentRow.last_seen_at,
                        HostAgentRow.fence_claimed_at < current - retry,
                    ),
                )
                .values(fence_claimed_at=current)
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(claimed, "rowcount", 0) == 1)

    def run_pass(self, heard_since: datetime | None = None) -> list[EvacuationResult]:
        """One automatic pass (fencing configured): fence the hosts that went silent (of
        those heard since ``heard_since``, if given), then place their VMs and what is
        left on hosts already down, all in one batch."""
        if self.fence_command is None:
            return []
        to_fence, again = self.due(heard_since)
        known: dict[str, str] = {}
        for name in to_fence:
            if not self.claim_fence(name):
                continue
            try:
                known.update([self._know_down(name, False)])
            except LoadmasterError as exc:
                log.error("host %s silent, not evacuated: %s", name, exc.detail)
        known.update((name, "already") for name in again if name not in known)
        return self._place(known, None, time.perf_counter()) if known else []


class AutoEvacuation:
    """The server process's thread running ``EvacuationService.run_pass`` every
    ``every_s`` (by default a quarter of the silence threshold, at most 5 s).

    For a grace after the process starts (a whole threshold plus the intervals at which
    long-polls are written as heard), only hosts whose agent was heard since the start
    are fenced: after an outage of every server (or at the first start) each agent's last
    word is old, and fencing on it would take the whole fleet down before its agents had a
    chance to reconnect; but a host heard since and silent for a threshold after is dead
    for this process as for any other, and is not left to wait out the grace."""

    def __init__(
        self,
        service: EvacuationService,
        *,
        every_s: float | None = None,
        grace_s: float | None = None,
    ) -> None:
        self._service = service
        self._every_s = every_s
        self._grace_s = grace_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def every_s(self) -> float:
        if self._every_s is not None:
            return self._every_s
        return min(5.0, self._service.silent_after.total_seconds() / 4)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="evacuation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def grace_s(self) -> float:
        if self._grace_s is not None:
            return self._grace_s
        return self._service.silent_after.total_seconds() + DEFAULT_REFRESH_S + DEFAULT_FLUSH_S

    def _run(self) -> None:
        started, grace_ends = now(), time.monotonic() + self.grace_s
        while not self._stopping.wait(self.every_s):
            try:
                self._service.run_pass(started if time.monotonic() < grace_ends else None)
            except Exception as exc:  # the database away: the next pass tries again
                log.warning("evacuation pass: %s", exc)


def _root(session: Session, host: str) -> HostRow:
    row = lookup.host_row(session, host)
    if row.parent_id is not None:
        raise ValidationError(
            f"host {row.name} is a child provider; evacuate its root host", field="host"
        )
    return row


def _heard_ago(session: Session, host_id: int) -> timedelta | None:
    seen = session.scalar(select(HostAgentRow.last_seen_at).where(HostAgentRow.host_id == host_id))
    return None if seen is None else now() - seen
