"""Evacuation: the VMs of a host that is down are placed elsewhere and started there.

A host is *known* down once it is fenced (the configured fence command, run with the
host's name, exits 0: oVirt fences through power management before it restarts highly
available VMs) or once the operator confirms it (``host evacuate HOST --confirm-down``).
Only then does the host go to state ``down`` and do its claims end: each VM's records
there go in the same transaction as its claim on the new host (the ledger's ``evacuate``
intent), so a VM is never on no host, and a VM that fits nowhere keeps its claim on the
dead host (shown there with the reason in its fault, placed by the next evacuation).
Without fencing or confirmation nothing changes: a host that is only silent may still
run its VMs.

Placement is the scheduler's, with every filter, group rule and pending claim: VMs tagged
``ha`` first, then by priority. Evacuating again places what is left; a VM already
evacuated is refused by the ledger under its row lock, so evacuations running side by
side (several server processes) never place a VM twice. A migration from or to a host
that is down is taken over: aborted back to its source when the destination died,
started on its destination when the source died (``lifecycle.take_over_migration``).

``AutoEvacuation`` runs in the server process when a fence command is configured. Each
pass judges the fleet as a whole: a host whose agent has been silent past
``agent_silent_after`` is fenced by one process (a compare-and-swap on
``host_agents.fence_claimed_at``, once per silence), unless more than half of the hosts
are *silent*: past the threshold, on their way to it (unheard for ``suspect_after``), or
fenced within the last threshold. Agents cut off together (a network partition, this
server's own trouble) fall silent a few seconds apart; counted one pass at a time, the
first few would each look like a minority and be fenced. Fences run side by side, each
in a process group killed at its timeout, so a hung one delays no other host; a failed
one is tried again after a backoff and reported on the host's agent status. The VMs of
hosts fenced are placed together, highly available ones first; the others wait while a
host holding ``ha`` VMs is on its way to the threshold or being fenced, so that the
``ha`` VMs of hosts dying together are placed before anyone else's take the room. A host that comes back stays
``down`` until the operator sets it ``up``; its agent stops what the ledger moved away,
since its work list no longer holds it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
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
from loadmaster.heartbeat import heard_gap, suspect_after
from loadmaster.hostcontrol.service import HostControl
from loadmaster.pending.lifecycle import TakenOver, take_over_migration
from loadmaster.scheduler.core.request import RequestSpec
from loadmaster.scheduler.drain import Unplaced
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
# More silent hosts than this share of the fleet: no host is fenced (see ``due``).
MAX_SILENT_SHARE = 0.5
# Of a fence command's output, the last this many bytes are kept (for the log and the
# error); the rest is read and dropped, so a chatty or hostile command costs no memory.
FENCE_OUTPUT_LIMIT = 16 * 1024
# A fence that failed is tried again after the threshold plus its timeout, doubled for
# each failure in a row up to this many times.
MAX_FENCE_BACKOFF = 8
# Fences that may run at once, each in a thread of its own.
FENCES_AT_ONCE = 8
PLACED = ("running", "pending", "migrating")


@dataclass(frozen=True)
class EvacuationResult:
    """``known_down``: how the host was known down (``fenced``, ``confirmed``, or
    ``already`` when it was down before this call). ``order``: the VMs in the order they
    were placed (highly available ones first). ``taken_over``: migrations from or to the
    host, VM -> ``aborted`` (back on its source) or ``landed`` (started on its
    destination, also in ``moved``). ``deferred``: VMs not tagged ``ha`` left for a later
    pass while hosts holding ``ha`` VMs are on their way to being fenced. ``names``: VM uuid -> name."""

    host: str
    known_down: str
    moved: dict[str, str]
    unplaced: tuple[Unplaced, ...]
    taken_over: dict[str, str]
    order: tuple[str, ...]
    seconds: float
    names: dict[str, str] = field(default_factory=dict)
    deferred: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "known_down": self.known_down,
            "moved": dict(self.moved),
            "unplaced": [u.to_dict() for u in self.unplaced],
            "taken_over": dict(self.taken_over),
            "deferred": list(self.deferred),
            "order": list(self.order),
            "seconds": self.seconds,
            "names": dict(self.names),
        }


@dataclass(frozen=True)
class FleetSilence:
    """One look at the fleet's agents (see ``EvacuationService.due``).

    ``to_fence``: hosts to fence now. ``down``: hosts down with VMs still placed there or
    migrating to or from them. ``approaching``: hosts unheard for ``suspect_after`` but
    not yet past the threshold, while fencing is not held back."""

    to_fence: tuple[str, ...]
    down: tuple[str, ...]
    approaching: tuple[str, ...]


class EvacuationService:
    """``lm.evacuation``: ``evacuate(host, confirm_down=, force=)``, ``fence(host)``, and
    the automatic pass ``run_pass``.

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
        # Set by AutoEvacuation: called when a fence of the automatic pass ends.
        self.on_fence_done: Callable[[], None] | None = None
        self._pool = ThreadPoolExecutor(FENCES_AT_ONCE, thread_name_prefix="fence")
        self._lock = threading.Lock()
        self._fencing: dict[str, Future[bool]] = {}
        self._processes: set[subprocess.Popen[bytes]] = set()

    @property
    def silent_after(self) -> timedelta:
        return self._control.silent_after

    @property
    def heard_every(self) -> float:
        return self._control.heard_every

    def kill_fences(self) -> None:
        """Kill the fences still running, with their process groups (the server stops):
        each counts as failed, and the next server's pass tries again."""
        with self._lock:
            processes = list(self._processes)
        for process in processes:
            _kill_group(process)

    # -- by the operator -------------------------------------------------------------------
    def evacuate(
        self,
        host: str,
        *,
        confirm_down: bool = False,
        force: bool = False,
        policy: str | None = None,
    ) -> EvacuationResult:
        """Know ``host`` down (it is already, the operator confirms it, or the fence
        command succeeds), then place its VMs elsewhere. Refused, changing nothing, while
        its agent is heard from (unless ``force`` with ``confirm_down``: the operator
        knows it is off, whatever its last word), or when the host is neither confirmed
        down nor fenced."""
        for name, value in (("confirm_down", confirm_down), ("force", force)):
            if not isinstance(value, bool):
                raise ValidationError(f"{name} must be true or false", field=name)
        if force and not confirm_down:
            raise ValidationError(
                "force only goes with confirm_down: it says you made sure the host is off",
                field="force",
            )
        started = time.perf_counter()
        name, known = self._know_down(host, confirm_down, force)
        return self._place({name: known}, policy, started)[0]

    def _know_down(self, host: str, confirm_down: bool, force: bool = False) -> tuple[str, str]:
        """The host's name once it is down, and how it is known to be (see
        ``EvacuationResult.known_down``)."""
        with self._store.read() as session:
            row = _root(session, host)
            name, state = row.name, row.state
            heard = _heard_ago(session, row.id)
        if state == "down":
            return name, "already"
        if heard is not None and heard <= self.silent_after and not force:
            raise Conflict(
                f"host {name}'s agent was heard {heard.total_seconds():.0f} s ago: a host "
                f"that answers is drained (loadmaster host drain {name}), not evacuated; if "
                f"you made sure it is off, say so: loadmaster host evacuate {name} "
                "--confirm-down --force",
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

    # -- fencing ---------------------------------------------------------------------------
    def fence(self, host: str) -> None:
        """Run the fence command with the host's name; FenceFailed unless it exits 0. The
        command runs in a process group of its own, killed whole at the timeout, and only
        the end of its output is kept."""
        if self.fence_command is None:
            raise Conflict("no fence command is configured", field="host")
        argv = [*self.fence_command, host]
        try:
            code, output = self._run_fence(argv)
        except OSError as exc:
            why = f"could not run: {exc}"
        else:
            if code == 0:
                log.warning("host %s fenced (%s)", host, shlex.join(argv))
                return
            said = output.strip().splitlines()
            if code is None:
                why = f"did not finish within {self.fence_timeout_s:g} s (killed)"
            else:
                why = f"exited {code}"
            why += f": {said[-1][:500]}" if said else ""
        log.error("fencing host %s failed: %s %s", host, shlex.join(argv), why)
        raise FenceFailed(
            f"fence command {shlex.join(argv)} {why}; host {host} is not known to be down "
            "and its claims are kept",
            field="host",
        )

    def _run_fence(self, argv: Sequence[str]) -> tuple[int | None, str]:
        """(exit code, None if killed at the timeout; the output's last part)."""
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with self._lock:
            self._processes.add(process)
        tail = bytearray()

        def read() -> None:
            assert process.stdout is not None
            while chunk := os.read(process.stdout.fileno(), 65536):
                tail.extend(chunk)
                del tail[:-FENCE_OUTPUT_LIMIT]

        reader = threading.Thread(target=read, name="fence-output", daemon=True)
        reader.start()
        try:
            code: int | None = process.wait(self.fence_timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            # What the command started dies with it: a power-off helper left running
            # could act after the host was judged, or hold the output open forever.
            _kill_group(process)
            process.wait()
            with self._lock:
                self._processes.discard(process)
        reader.join(timeout=1.0)
        return code, bytes(tail).decode(errors="replace")

    def _fence_down(self, name: str) -> bool:
        """Fence ``name`` and mark it down; the outcome recorded on its agent's row."""
        try:
            self.fence(name)
            self._mark_down(name)
        except LoadmasterError as exc:
            self._fence_ended(name, exc.detail)
            log.error("host %s silent, not evacuated: %s", name, exc.detail)
            return False
        except Exception as exc:  # the database away: the next silence pass tries again
            self._fence_ended(name, str(exc))
            log.error("host %s silent, not evacuated: %s", name, exc)
            return False
        else:
            self._fence_ended(name, None)
            return True
        finally:
            if self.on_fence_done is not None:
                self.on_fence_done()

    def _fence_ended(self, name: str, error: str | None) -> None:
        with contextlib.suppress(Exception), self._store.write() as session:
            row = _root(session, name)
            agent = session.get(HostAgentRow, row.id)
            if agent is not None:
                agent.fence_failures = 0 if error is None else agent.fence_failures + 1
                agent.fence_error = None if error is None else error[:2000]

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

    # -- placing ---------------------------------------------------------------------------
    def _say_why(
        self, vms: Sequence[VmRow], origin: Mapping[str, str], known: Mapping[str, str]
    ) -> None:
        """Each VM's fault says that its host is down, before the evacuation moves it: the
        move is the host's doing. Written once per host going down, so a VM that fits
        nowhere costs no write at each pass (nor loses how its host was known down)."""
        why = {}
        for vm in vms:
            host = origin[vm.uuid]
            if not (vm.fault or "").startswith(f"host {host} is down"):
                why[vm.uuid] = f"host {host} is {KNOWN_DOWN[known[host]]}: evacuated"
        if not why:
            return
        with self._store.write() as session:
            for uuid, row in lock_vms(session, why).items():
                row.fault = why[uuid]

    def _place(
        self,
        known: Mapping[str, str],
        policy: str | None,
        started: float,
        *,
        defer_plain: bool = False,
    ) -> list[EvacuationResult]:
        """Place the VMs of the hosts ``known`` down (name -> how) in one scheduler batch
        per wave, however many hosts died together; a result per host. Migrations with
        an end on one of them are taken over first. ``defer_plain``: VMs not tagged
        ``ha`` wait for a later call."""
        with self._store.read() as session:
            ids = {_root(session, name).id: name for name in known}
        taken_over = self._take_over_migrations(ids)
        with self._store.read() as session:
            vms = list(
                session.scalars(
                    select(VmRow)
                    .where(VmRow.state.in_(("running", "pending")), VmRow.host_id.in_(ids))
                    .order_by(VmRow.id)
                )
            )
        origin = {v.uuid: ids[v.host_id] for v in vms if v.host_id is not None}
        staying = sorted(
            vms, key=lambda v: (HA_TAG not in v.tags, -priority_of(v.tags), v.name, v.uuid)
        )
        self._say_why(staying, origin, known)
        # Two calls, not one batch: short of room, the highly available VMs get it.
        waves = [
            [v.uuid for v in staying if HA_TAG in v.tags],
            [] if defer_plain else [v.uuid for v in staying if HA_TAG not in v.tags],
        ]
        deferred = [v.uuid for v in staying if HA_TAG not in v.tags] if defer_plain else []
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
        self._say_unplaced(unplaced, origin, known)
        seconds = time.perf_counter() - started
        if staying or taken_over:
            log.warning(
                "host(s) %s: %d VMs evacuated in %.3f s, %d left, %d deferred, %d "
                "migrations taken over",
                ", ".join(known),
                len(moved),
                seconds,
                len(unplaced),
                len(deferred),
                len(taken_over),
            )
        names = {v.uuid: v.name for v in vms} | {vm: n for vm, (n, _) in taken_over.items()}
        origin |= {vm: t.dead_host for vm, (_, t) in taken_over.items()}
        landed = {vm: t.landed_on for vm, (_, t) in taken_over.items() if t.landed_on}
        return [
            EvacuationResult(
                name,
                how,
                {vm: host for vm, host in (moved | landed).items() if origin[vm] == name},
                tuple(u for u in unplaced if origin[u.vm] == name),
                {vm: t.outcome for vm, (_, t) in taken_over.items() if t.dead_host == name},
                tuple(v.uuid for v in staying if origin[v.uuid] == name),
                seconds,
                {vm: n for vm, n in names.items() if origin[vm] == name},
                tuple(vm for vm in deferred if origin[vm] == name),
            )
            for name, how in known.items()
        ]

    def _take_over_migrations(self, down: Mapping[int, str]) -> dict[str, tuple[str, TakenOver]]:
        """VM -> (its name, what became of its migration), for each migration from or to
        a host in ``down``."""
        with self._store.read() as session:
            migrating = session.execute(
                select(VmRow.uuid, VmRow.name)
                .where(
                    VmRow.state == "migrating",
                    or_(VmRow.host_id.in_(down), VmRow.target_host_id.in_(down)),
                )
                .order_by(VmRow.id)
            ).all()
        taken: dict[str, tuple[str, TakenOver]] = {}
        for vm, vm_name in migrating:
            with self._store.write() as session:
                outcome = take_over_migration(session, vm, set(down))
            if outcome is None:
                continue  # it ended meanwhile (its destination said up, say)
            taken[vm] = (vm_name, outcome)
            log.warning(
                "VM %s: migration %s (host %s is down)%s",
                vm_name,
                outcome.outcome,
                outcome.dead_host,
                f", started on {outcome.landed_on}" if outcome.landed_on else "",
            )
        return taken

    def _say_unplaced(
        self, unplaced: Sequence[Unplaced], origin: Mapping[str, str], known: Mapping[str, str]
    ) -> None:
        """Each VM left on a dead host says why in its fault (once, not at every pass)."""
        why = {}
        for u in unplaced:
            host = origin[u.vm]
            why[u.vm] = (
                f"host {host} is {KNOWN_DOWN[known[host]]}: no other host fits it yet "
                f"({u.error.detail[:1500]}); evacuated when room is found"
            )
        if not why:
            return
        with self._store.write() as session:
            for uuid, row in lock_vms(session, why).items():
                said = row.fault or ""
                if row.state in ("running", "pending") and "no other host fits it yet" not in said:
                    row.fault = why[uuid]

    # -- the automatic pass ----------------------------------------------------------------
    def due(self, heard_since: datetime | None = None) -> FleetSilence:
        """The fleet's silences now (see ``FleetSilence``).

        None is fenced when more than ``MAX_SILENT_SHARE`` of the fleet is silent, every
        silence counted at once: hosts past the threshold, hosts unheard for
        ``suspect_after`` (on their way to it) and hosts fenced within the last
        threshold, of the hosts up plus those fenced. So many silences together say more
        about this server (its network, its load) than about the hosts, as oVirt's
        fencing policy skips fencing on cluster connectivity issues.
        ``heard_since``: only hosts whose agent was heard at or after it are fenced."""
        current = now()
        threshold = self.silent_after
        cutoff = current - threshold
        suspect_cut = current - timedelta(
            seconds=suspect_after(threshold.total_seconds(), self.heard_every)
        )
        with self._store.read() as session:
            agents = session.execute(
                select(
                    HostRow.id,
                    HostRow.name,
                    HostRow.state,
                    HostAgentRow.last_seen_at,
                    HostAgentRow.fence_claimed_at,
                )
                .join(HostAgentRow, HostAgentRow.host_id == HostRow.id)
                .where(HostRow.parent_id.is_(None))
                .order_by(HostRow.id)
            ).all()
            down_ids = [a.id for a in agents if a.state == "down"]
            with_vms = set(
                session.scalars(
                    select(VmRow.host_id).where(
                        VmRow.host_id.in_(down_ids), VmRow.state.in_(PLACED)
                    )
                )
            ) | set(
                session.scalars(
                    select(VmRow.target_host_id).where(
                        VmRow.target_host_id.in_(down_ids), VmRow.state == "migrating"
                    )
                )
            )
        up = [a for a in agents if a.state != "down"]
        recently_fenced = [
            a
            for a in agents
            if a.state == "down" and a.fence_claimed_at is not None and a.fence_claimed_at >= cutoff
        ]
        silent = [a for a in up if a.last_seen_at < suspect_cut]
        fleet = len(up) + len(recently_fenced)
        to_fence = [
            a.name
            for a in up
            if a.last_seen_at < cutoff and (heard_since is None or a.last_seen_at >= heard_since)
        ]
        held_back = len(silent) + len(recently_fenced) > MAX_SILENT_SHARE * fleet
        if to_fence and held_back:
            log.warning(
                "%d of %d hosts' agents are silent or were fenced within %g s: more likely "
                "this server's trouble than that many dead hosts; none fenced",
                len(silent) + len(recently_fenced),
                fleet,
                threshold.total_seconds(),
            )
        approaching = () if held_back else tuple(a.name for a in silent if a.last_seen_at >= cutoff)
        return FleetSilence(
            () if held_back else tuple(to_fence),
            tuple(a.name for a in agents if a.id in with_vms),
            approaching,
        )

    def claim_fence(self, host: str) -> bool:
        """Whether this process fences ``host`` now: it still is silent and no process has
        taken it on since its agent was last heard (or that one's try failed long enough
        ago: the threshold plus the fence's timeout, doubled for each failure in a row)."""
        current = now()
        with self._store.write() as session:
            row = _root(session, host)
            agent = session.get(HostAgentRow, row.id)
            if agent is None or agent.last_seen_at >= current - self.silent_after:
                return False
            claimed = agent.fence_claimed_at
            new_silence = claimed is None or claimed < agent.last_seen_at
            failures = 0 if new_silence else agent.fence_failures
            if (
                not new_silence
                and claimed is not None
                and claimed >= current - self._retry(failures)
            ):
                return False
            took = session.execute(
                update(HostAgentRow)
                .where(
                    HostAgentRow.host_id == row.id,
                    HostAgentRow.fence_claimed_at.is_(None)
                    if claimed is None
                    else HostAgentRow.fence_claimed_at == claimed,
                )
                .values(fence_claimed_at=current, fence_failures=failures)
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(took, "rowcount", 0) == 1)

    def _retry(self, failures: int) -> timedelta:
        once = self.silent_after + timedelta(seconds=self.fence_timeout_s)
        return once * min(MAX_FENCE_BACKOFF, 2 ** max(0, failures - 1))

    def run_pass(
        self, heard_since: datetime | None = None, *, wait: bool = True
    ) -> list[EvacuationResult]:
        """One automatic pass (fencing configured): start fencing the hosts that went
        silent (of those heard since ``heard_since``, if given), each in a thread; then
        place the VMs of the hosts down: those fenced meanwhile and those with VMs left.
        ``wait``: for this pass's fences to end first (the automatic thread does not: a
        fence that hangs holds up no other host; the next pass places its VMs)."""
        if self.fence_command is None:
            return []
        fleet = self.due(heard_since)
        with self._lock:
            for name in fleet.to_fence:
                if name not in self._fencing and self.claim_fence(name):
                    self._fencing[name] = self._pool.submit(self._fence_down, name)
            under_way = list(self._fencing.values())
        if wait:
            wait_for(under_way)
        fenced: dict[str, str] = {}
        with self._lock:
            for name, future in list(self._fencing.items()):
                if future.done():
                    del self._fencing[name]
                    if future.result():
                        fenced[name] = "fenced"
            coming = set(fleet.approaching) | set(self._fencing)
        known = {name: "already" for name in fleet.down} | fenced
        if not known:
            return []
        defer = self._holds_ha_vms(coming)
        return self._place(known, None, time.perf_counter(), defer_plain=defer)

    def _holds_ha_vms(self, hosts: set[str]) -> bool:
        """Whether any of these hosts (on their way to being fenced) runs a VM tagged
        ``ha``: only then do the others' VMs wait for them."""
        if not hosts:
            return False
        with self._store.read() as session:
            tags = session.scalars(
                select(VmRow.tags)
                .join(HostRow, HostRow.id == VmRow.host_id)
                .where(HostRow.name.in_(hosts), VmRow.state.in_(PLACED))
            )
            return any(HA_TAG in t for t in tags)


class AutoEvacuation:
    """The server process's thread running ``EvacuationService.run_pass`` every
    ``every_s`` (by default a quarter of the silence threshold, at most 5 s), and at once
    when a fence ends.

    For a grace after the process starts (a whole threshold plus the longest a live agent
    may go unrecorded), only hosts whose agent was heard since the start are fenced:
    after an outage of every server (or at the first start) each agent's last word is
    old, and fencing on it would take the whole fleet down before its agents had a
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
        self._stopping = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def every_s(self) -> float:
        if self._every_s is not None:
            return self._every_s
        return min(5.0, self._service.silent_after.total_seconds() / 4)

    def start(self) -> None:
        self._service.on_fence_done = self._wake.set
        self._thread = threading.Thread(target=self._run, name="evacuation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self._service.kill_fences()

    @property
    def grace_s(self) -> float:
        if self._grace_s is not None:
            return self._grace_s
        heard = heard_gap(self._service.heard_every)
        return self._service.silent_after.total_seconds() + heard

    def _run(self) -> None:
        started, grace_ends = now(), time.monotonic() + self.grace_s
        while True:
            self._wake.wait(self.every_s)
            self._wake.clear()
            if self._stopping:
                return
            try:
                self._service.run_pass(
                    started if time.monotonic() < grace_ends else None, wait=False
                )
            except Exception as exc:  # the database away: the next pass tries again
                log.warning("evacuation pass: %s", exc)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _root(session: Session, host: str) -> HostRow:
    return lookup.root_host_row(session, host, "evacuate its root host")


def _heard_ago(session: Session, host_id: int) -> timedelta | None:
    seen = session.scalar(select(HostAgentRow.last_seen_at).where(HostAgentRow.host_id == host_id))
    return None if seen is None else now() - seen
