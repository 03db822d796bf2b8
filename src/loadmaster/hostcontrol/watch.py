"""One watcher per server process, where every host agent's long-poll waits and where the
process hears from agents.

A waiting agent costs a connection and a future: no thread, no database connection, no
polling of its own. What wakes it:

- a write transaction of this process that stamped its host on the cluster clock (a
  claim, an activation, new tags): ``Store.listen`` tells the watcher once it commits, and
  the host's waiters wake at once;
- a change made by another process (``serve --workers N``, another ``serve`` on the same
  PostgreSQL): one query for the whole process reads the hosts stamped since the last
  one (``locking.clock_and_changed``), whatever the number of waiters. On PostgreSQL it
  runs when the committing transaction's NOTIFY arrives (and every second regardless);
  on SQLite, which cannot notify, once per tick.

The same query keeps a cache of every root host's generation, so a long-poll that arrives
with nothing new to tell waits without reading the database, and one that times out
answers "unchanged" without reading it either.

Work lists are kept as last read, and answered from memory while their host has not
moved (neither its generation as cached nor a commit of this process): the lists of
hosts with no VM are known from the full read of the hosts, so most of a fleet's first
reads after a restart cost no statement. The others wait for the next batch read, all
the hosts asked meanwhile plus a statement's worth of hosts with VMs not read yet, in one
read transaction (``worklists.read_work_lists``).

Liveness: every request of an agent, and every long-poll it holds open (the server keeps
TCP keep-alive probes on its connections, so a dead peer's connection ends), counts as
hearing from it. What was heard is written in bulk, one statement per flush for the whole
process, and a held poll only every ``refresh_s``: an idle fleet costs the database a
statement every few seconds, not one per agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.errors import Busy, NotFound, ValidationError
from loadmaster.heartbeat import DEFAULT_HEARD_EVERY_S, flush_every
from loadmaster.hostcontrol.worklists import LISTED_STATES, WorkList, read_work_lists
from loadmaster.scheduler.reports import write_measurements
from loadmaster.store import ClockNotices, Store
from loadmaster.store.chunks import IN_LIST_ROWS, in_chunks
from loadmaster.store.locking import clock_and_changed, now
from loadmaster.store.schema import HostAgentRow, HostRow, VmRow

log = logging.getLogger(__name__)

# How often other processes' changes are looked for: the cross-process wake-up's delay,
# and on SQLite a little CPU each tick (docs/architecture.md, Figures behind the design).
DEFAULT_TICK_S = 0.1
# Where the database notifies watchers of commits (PostgreSQL), the clock is still read
# every this many ticks without one.
NOTICED_TICKS = 10
# A wait for a notice is cut in slices this long at most, so that stopping is quick.
STOP_CHECK_S = 0.5
# Hosts whose work lists may wait for the next batch read: past that an agent is told
# to come back later (503), so a fleet starting together cannot queue the placements and
# reads of everyone else behind its first reads. Each agent turned away is given a turn
# of its own (``Retry-After``), one read's measured cost after the last one given and at
# most this many a second, so that agents refused together come back spread over the
# time the server needs to read their lists and find room when they do.
MAX_QUEUED_READS = 2048
# Hosts with VMs whose lists this process has never read are read ahead with each batch,
# this many at most (a statement's worth): the first agents of a fleet starting together
# bring in the lists of those that follow, which are then answered from memory.
READ_AHEAD = IN_LIST_ROWS
# A batch of this many hosts or more counts fully in the estimate of a read's cost; a
# smaller one (a single wake-up) counts less, its fixed cost spread over fewer hosts.
FULL_BATCH = 64


@dataclass(frozen=True)
class WatchedHost:
    id: int
    name: str


class HostWatch:
    """``await start()`` in the server's event loop, ``await stop()`` at its end."""

    def __init__(
        self,
        store: Store,
        *,
        tick_s: float = DEFAULT_TICK_S,
        refresh_s: float = DEFAULT_HEARD_EVERY_S,
        runs_written: Callable[[], None] | None = None,
    ) -> None:
        """``refresh_s``: a held long-poll is written as heard this often
        (``agent_heard_every``); what was heard is flushed as ``heartbeat.flush_every``.
        ``runs_written``: called once a flush wrote news of managers' runs (the process's
        scheduler reads the agents again)."""
        self._store = store
        self._runs_written = runs_written
        self.tick_s = tick_s
        self.flush_s = flush_every(refresh_s)
        self.refresh_s = refresh_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ticker: threading.Thread | None = None
        self._stopping = threading.Event()
        self._unlisten: object = None
        self._deaf = False
        self._since = 0
        self._layout = -1
        # Root hosts by name and by uuid, and their generations as last read.
        self._hosts: dict[str, WatchedHost] = {}
        self._generations: dict[int, int] = {}
        self._waiters: dict[int, set[asyncio.Future[str]]] = {}
        self._heard: set[int] = set()
        # Work lists as last read, with ``commits`` as taken before the read: still the
        # host's list while the host has moved neither in the database nor by a commit of
        # this process. Hosts whose lists wait for the next batch read, and its reader.
        self._lists: dict[int, tuple[WorkList, int]] = {}
        self._pending: dict[int, list[asyncio.Future[WorkList]]] = {}
        # Hosts with VMs whose lists this process has not read yet (read ahead).
        self._unread: set[int] = set()
        self._reader: asyncio.Task[None] | None = None
        # What one host's list costs in a batch (moving average), and the latest turn given.
        self._read_s = 0.001
        self._next_turn = 0.0
        # Per host: commits of this process that stamped it, and how many of them the
        # last read of its work list had seen.
        self._commits: dict[int, int] = {}
        self._read: dict[int, int] = {}
        # Long-polls held open by hosts' own agents, by host.
        self._held: dict[int, int] = {}
        self._written: dict[int, float] = {}
        # Measurements heard since the last flush, host id -> (usage, load): written with
        # liveness, in bulk. Reports arrive on the API's threads, hence the lock (which
        # guards managers' runs below as well).
        self._measured: dict[int, tuple[Mapping[str, float], Mapping[str, float]]] = {}
        self._said_lock = threading.Lock()
        # Per host, the run of its manager last heard and the run that last read its work
        # list, as this process knows them; and those not written yet (under the lock).
        self._runs: dict[int, str] = {}
        self._listed_runs: dict[int, str] = {}
        self._runs_due: dict[int, str] = {}
        self._listed_due: dict[int, str] = {}
        # Set when a manager's first read must be written at once (``ran``).
        self._flush_now: asyncio.Event | None = None
        # The server is stopping: no wait lasts (``release``).
        self._released = False

    # -- life -----------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._flush_now = asyncio.Event()
        await asyncio.to_thread(self._poll)
        self._unlisten = self._store.listen(self._committed)
        # The tick runs in a thread of its own, not as a task handing each poll to a
        # thread pool, which costs more CPU a tick.
        self._ticker = threading.Thread(target=self._tick, name="host-watch", daemon=True)
        self._ticker.start()
        self._task = asyncio.create_task(self._flush_every(), name="host-watch-flush")

    async def stop(self) -> None:
        self._stopping.set()
        for task in (self._task, self._reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._ticker is not None:
            await asyncio.to_thread(self._ticker.join)
        if callable(self._unlisten):
            self._unlisten()
        self.release()
        with contextlib.suppress(Exception):  # the database may be what is going away
            await self._flush()

    def release(self) -> None:
        """The server starts to stop: every wait ends now, as if its time ran out, and
        none starts, so each held long-poll is answered (its list, or 304) before the
        server closes its connection (on the event loop)."""
        self._released = True
        for futures in self._waiters.values():
            for future in futures:
                _settle(future, "timeout")

    # -- what long-polls ask --------------------------------------------------------------
    async def host(self, ident: str) -> WatchedHost:
        """The root host named (or with the uuid) ``ident``; read once, then cached."""
        cached = self.cached_host(ident)
        if cached is not None:
            return cached
        found, uuid = await asyncio.to_thread(self._read_host, ident)
        # Under its name and its uuid as stored, never under the spelling asked for: a
        # uuid has countless spellings (any case, hyphens anywhere), and a client making
        # them up would grow the cache without end.
        hosts = self._hosts
        hosts[found.name] = hosts[uuid] = found
        return found

    async def work_list(self, host: WatchedHost) -> WorkList:
        """The host's work list: as this process last read it while the host has not moved
        since, else read with every other list asked meanwhile in one batch; ``Busy``
        when too many hosts wait for one."""
        kept = self._lists.get(host.id)
        if kept is not None and self._still(host.id, *kept):
            # As a read would: the caller has seen every commit the list has.
            self.saw(host.id, kept[0].generation, kept[1])
            return kept[0]
        waiting = self._pending.get(host.id)
        if waiting is None:
            if len(self._pending) >= MAX_QUEUED_READS:
                raise Busy(
                    f"{len(self._pending)} work lists are waiting to be read; come back later",
                    retry_after_s=self._later_turn(),
                )
            waiting = self._pending[host.id] = []
        assert self._loop is not None, "HostWatch.start() first"
        future: asyncio.Future[WorkList] = self._loop.create_future()
        waiting.append(future)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_batches(), name="host-watch-reads")
        return await future

    def _still(self, host_id: int, work_list: WorkList, commits: int) -> bool:
        """Whether ``work_list``, read after ``commits`` commits of this process had
        stamped the host, is still the host's."""
        return (
            self._generations.get(host_id, -1) <= work_list.generation
            and self._commits.get(host_id, 0) == commits
        )

    async def _read_batches(self) -> None:
        """Reads the lists of every host waiting, a batch at a time, until none waits."""
        while self._pending:
            batch, self._pending = self._pending, {}
            ahead = list(itertools.islice(self._unread - batch.keys(), READ_AHEAD))
            commits = {h: self._commits.get(h, 0) for h in itertools.chain(batch, ahead)}
            try:
                lists, took = await asyncio.to_thread(self._read_lists, list(commits))
            except Exception as exc:  # the database away: each caller hears why
                for futures in batch.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(exc)
                continue
            # Timed in the reading thread: the read alone, not its wait for a thread.
            weight = len(commits) / (len(commits) + FULL_BATCH)
            self._read_s += weight * (took / len(commits) - self._read_s)
            for host_id, listed in lists.items():
                self.saw(host_id, listed.generation, commits[host_id])
                self._lists[host_id] = (listed, commits[host_id])
            self._unread.difference_update(commits)
            for host_id, futures in batch.items():
                work_list = lists.get(host_id)
                for future in futures:
                    if future.done():
                        continue
                    if work_list is None:
                        future.set_exception(
                            NotFound(f"host {host_id}: no such host", field="host")
                        )
                    else:
                        future.set_result(work_list)

    def _read_lists(self, host_ids: list[int]) -> tuple[dict[int, WorkList], float]:
        started = time.perf_counter()
        with self._store.read() as session:
            lists = read_work_lists(session, host_ids)
        return lists, time.perf_counter() - started

    def _later_turn(self) -> int:
        """Seconds until a turn no other refused agent was given (at least 1)."""
        current = time.monotonic()
        spacing = max(self._read_s, 1 / MAX_QUEUED_READS)
        self._next_turn = max(self._next_turn, current + 1) + spacing
        return math.ceil(self._next_turn - current)

    def maybe_newer(self, host_id: int, after: int) -> bool:
        """Whether the host may be past generation ``after``: its cached generation is,
        or a commit of this process stamped it since the caller's last read (``saw``)."""
        return self._generations.get(host_id, -1) > after or self._commits.get(
            host_id, 0
        ) != self._read.get(host_id, 0)

    def commits(self, host_id: int) -> int:
        """How many commits of this process stamped the host: taken before a read."""
        return self._commits.get(host_id, 0)

    def cached_host(self, ident: str) -> WatchedHost | None:
        hosts = self._hosts
        return hosts.get(ident) or hosts.get(lookup.canonical_uuid(ident))

    def cached_generation(self, ident: str) -> int | None:
        found = self.cached_host(ident)
        return None if found is None else self._generations.get(found.id)

    def saw(self, host_id: int, generation: int, commits: int | None = None) -> None:
        """A generation read from the database by a caller (a work list): never older.
        ``commits``: ``commits(host_id)`` as taken before the read, all of them seen."""
        if generation > self._generations.get(host_id, -1):
            self._generations[host_id] = generation
        if commits is not None:
            self._read[host_id] = commits

    async def hold(
        self,
        host_id: int,
        after: int,
        timeout: float,
        gone: Callable[[], Awaitable[object]],
        *,
        agent: bool = False,
    ) -> str:
        """Until the host may be past generation ``after`` (``"changed"``), ``timeout``
        passes (``"timeout"``), or what ``gone()`` makes completes (``"gone"``: the
        client hung up); ``agent`` as for ``wait``."""
        deadline = time.monotonic() + timeout
        while not self.maybe_newer(host_id, after):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._released:
                return "timeout"
            woke = await self.wait(host_id, remaining, gone(), agent=agent)
            if woke != "changed":
                return woke
        return "changed"

    async def wait(
        self, host_id: int, timeout: float, gone: Awaitable[object], *, agent: bool = False
    ) -> str:
        """Until the host may have changed (``"changed"``; the caller checks its
        generation), ``timeout`` passes (``"timeout"``) or ``gone`` completes (``"gone"``:
        the client hung up). ``agent``: the host's agent is the one waiting, which counts
        as hearing from it."""
        assert self._loop is not None, "HostWatch.start() first"
        # One future settled by whichever comes first (a wake-up, the timer, the hang-up):
        # ``asyncio.wait`` would add a coroutine, futures and callbacks of its own to every
        # one of thousands of waits, for the garbage collector to walk.
        future: asyncio.Future[str] = self._loop.create_future()
        waiters = self._waiters.setdefault(host_id, set())
        waiters.add(future)
        hung_up = asyncio.ensure_future(gone)
        hung_up.add_done_callback(functools.partial(_settle, future, "gone"))
        timer = self._loop.call_later(timeout, _settle, future, "timeout")
        if agent:
            self._held[host_id] = self._held.get(host_id, 0) + 1
        try:
            return await future
        finally:
            timer.cancel()
            hung_up.cancel()
            if agent:
                held = self._held.pop(host_id) - 1
                if held:
                    self._held[host_id] = held
            waiters.discard(future)
            if not waiters:
                self._waiters.pop(host_id, None)

    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    # -- liveness -------------------------------------------------------------------------
    def heard(self, host_id: int) -> None:
        """The host's agent said something: written with the next flush."""
        self._heard.add(host_id)

    def measured(self, host_id: int, usage: Mapping[str, float], load: Mapping[str, float]) -> None:
        """The host's agent measured ``usage`` and ``load`` (checked; either may be empty:
        its figures keep their last value): written with the next flush, the latest
        report of each host only."""
        with self._said_lock:
            earlier = self._measured.get(host_id)
            if earlier is not None:
                usage, load = usage or earlier[0], load or earlier[1]
            self._measured[host_id] = (usage, load)

    def ran(self, host_id: int, run: str, *, listed: bool = False) -> None:
        """The host's manager of run ``run`` (``heartbeat.AGENT_RUN_HEADER``) spoke;
        ``listed``: it was answered its work list (or that the list it holds is current).
        Written with the next flush when it is news, at once for a run's first list: the
        host takes VMs from then on (from any thread)."""
        with self._said_lock:
            if self._runs.get(host_id) != run:
                self._runs[host_id] = self._runs_due[host_id] = run
            first = listed and self._listed_runs.get(host_id) != run
            if first:
                self._listed_runs[host_id] = self._listed_due[host_id] = run
        loop, flush_now = self._loop, self._flush_now
        if first and loop is not None and flush_now is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(flush_now.set)

    def _take_measured(self) -> dict[int, tuple[Mapping[str, float], Mapping[str, float]]]:
        with self._said_lock:
            taken, self._measured = self._measured, {}
        return taken

    # -- the loop -------------------------------------------------------------------------
    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        notices = self._store.clock_notices()
        next_read = 0.0
        try:
            while not self._stopping.is_set():
                if notices is None:
                    self._stopping.wait(self.tick_s)
                elif (
                    not self._noticed(notices, next_read - time.monotonic())
                    and time.monotonic() < next_read
                ):
                    continue  # no notice within a slice: see whether to stop
                if self._stopping.is_set():
                    return
                next_read = time.monotonic() + self.tick_s * NOTICED_TICKS
                try:
                    changed = self._poll()
                except Exception as exc:  # the database away: keep the waiters, try again
                    log.warning("host watch: %s", exc)
                    self._stopping.wait(1.0)
                    continue
                if changed:
                    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                        loop.call_soon_threadsafe(self._apply, changed)
        finally:
            if notices is not None:
                notices.close()

    def _noticed(self, notices: ClockNotices, remaining: float) -> bool:
        """Whether a commit was notified within the next slice of ``remaining`` s. Without
        notices (the listening connection refused or broken), every tick counts as one:
        the clock is read once a tick, as on SQLite, until listening works again."""
        try:
            noticed = notices.wait(min(self.tick_s, STOP_CHECK_S, max(0.0, remaining)))
        except Exception as exc:
            if not self._deaf:
                log.warning("host watch: not notified of commits (%s); reading every tick", exc)
            self._deaf = True
            self._stopping.wait(self.tick_s)
            return True
        if self._deaf:
            log.info("host watch: notified of commits again")
        self._deaf = False
        return noticed

    async def _flush_every(self) -> None:
        flush_now = self._flush_now
        assert flush_now is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(flush_now.wait(), self.flush_s)
            flush_now.clear()
            try:
                await self._flush()
            except Exception as exc:  # liveness written with the next flush
                log.warning("host watch: liveness and measurements not written: %s", exc)

    async def _flush(self) -> None:
        with self._said_lock:
            runs, self._runs_due = self._runs_due, {}
            listed, self._listed_due = self._listed_due, {}
        try:
            await asyncio.to_thread(
                self._write_heard,
                self._due(time.monotonic()),
                self._take_measured(),
                runs,
                listed,
            )
        except Exception:
            # What managers said of their runs is said once: kept for the next flush,
            # unless newer news came meanwhile.
            with self._said_lock:
                self._runs_due = {**runs, **self._runs_due}
                self._listed_due = {**listed, **self._listed_due}
            raise

    def _poll(self) -> list[tuple[int, int]]:
        """(host id, generation) of the root hosts stamped since the last poll; the whole
        set of root hosts again when providers were added, removed or moved, and the
        (empty) work list of each that has no VM on it."""
        commits = dict(self._commits)
        with self._store.read() as session:
            (seq, layout), changed = clock_and_changed(session, self._since)
            if layout != self._layout:
                hosts: dict[str, WatchedHost] = {}
                generations: dict[int, int] = {}
                empty: dict[int, tuple[WorkList, int]] = {}
                roots = session.execute(
                    select(
                        HostRow.id, HostRow.name, HostRow.uuid, HostRow.generation, HostRow.state
                    ).where(HostRow.parent_id.is_(None))
                ).all()
                # Read after the generations: a VM placed in between moved its host past
                # the generation read, so no host is taken for empty at a generation at
                # which it was not.
                busy = _hosts_with_vms(session)
                for host_id, name, uuid, generation, state in roots:
                    hosts[name] = hosts[uuid] = WatchedHost(host_id, name)
                    generations[host_id] = generation
                    if host_id not in busy:
                        empty[host_id] = (
                            WorkList(name, generation, state),
                            commits.get(host_id, 0),
                        )
                # Replaced whole (one assignment each): the event loop reads them meanwhile.
                self._hosts, self._generations = hosts, generations
                self._lists.update(empty)
                # ``list()`` copies at once what the event loop may add to meanwhile.
                self._unread = busy.difference(list(self._lists))
                self._layout = layout
        self._since = seq
        return [(host_id, generation) for host_id, _seq, generation in changed]

    def _apply(self, changed: Iterable[tuple[int, int]]) -> None:
        for host_id, generation in changed:
            if host_id in self._generations:
                self.saw(host_id, generation)
                self._wake(host_id)

    def _committed(self, host_ids: frozenset[int]) -> None:
        # In the committing thread, before its caller hears of the commit: counted here,
        # a long-poll arriving next reads the host (``maybe_newer``) even before the event
        # loop runs the wake-up handed to it.
        for host_id in host_ids:
            self._commits[host_id] = self._commits.get(host_id, 0) + 1
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake_all, host_ids)

    def _wake_all(self, host_ids: Iterable[int]) -> None:
        for host_id in host_ids:
            self._wake(host_id)

    def _wake(self, host_id: int) -> None:
        for future in self._waiters.get(host_id, ()):
            _settle(future, "changed")

    def _due(self, current: float) -> list[int]:
        """The hosts to write as heard now (on the event loop: the sets are its own)."""
        due = {
            host_id
            for host_id in self._held
            if current - self._written.get(host_id, -self.refresh_s) >= self.refresh_s
        }
        ids = sorted(self._heard | due)
        self._heard = set()
        for host_id in ids:
            self._written[host_id] = current
        return ids

    def _write_heard(
        self,
        ids: list[int],
        measured: Mapping[int, tuple[Mapping[str, float], Mapping[str, float]]],
        runs: Mapping[int, str],
        listed: Mapping[int, str],
    ) -> None:
        if not (ids or measured or runs or listed):
            return
        at = now()
        with self._store.write() as session:
            for chunk in in_chunks(ids):
                session.execute(_HEARD, {"hosts": chunk, "at": at})
            if measured:
                write_measurements(session, measured)
            # Heard as well: schedulers read again the agents heard since their last read.
            for statement, news in ((_RAN, runs), (_LISTED, listed)):
                if news:
                    session.execute(
                        statement, [{"host": h, "run": r, "at": at} for h, r in news.items()]
                    )
        if (runs or listed) and self._runs_written is not None:
            self._runs_written()

    def _read_host(self, ident: str) -> tuple[WatchedHost, str]:
        """The root host ``ident`` and its uuid as stored."""
        with self._store.read() as session:
            row = lookup.host_row(session, ident)
            if row.parent_id is not None:
                raise ValidationError(f"host {ident} is a child provider", field="host")
            self.saw(row.id, row.generation)
            return WatchedHost(row.id, row.name), row.uuid


def _hosts_with_vms(session: Session) -> set[int]:
    """The hosts some VM's work is listed on (as its host or its migration's target)."""
    listed = VmRow.state.in_(LISTED_STATES)
    return {
        int(host_id)
        for column in (VmRow.host_id, VmRow.target_host_id)
        for host_id in session.scalars(select(column).where(listed, column.is_not(None)).distinct())
        if host_id is not None
    }


def _settle(future: asyncio.Future[str], outcome: str, *_: object) -> None:
    """A wait's outcome, if it has none yet (the first of wake-up, timer and hang-up)."""
    if not future.done():
        future.set_result(outcome)


_AGENTS = HostAgentRow.metadata.tables["host_agents"]
# Every host of a flush was heard at one time: a statement per few hundred hosts, where
# an executemany of a row each spent a third of an idle server's CPU binding the rows'
# parameters (10,000 waiting agents: 1,000 rows a second).
_HEARD = (
    update(_AGENTS)
    .where(_AGENTS.c.host_id.in_(bindparam("hosts", expanding=True)))
    .values(last_seen_at=bindparam("at"))
)
_RAN = (
    update(_AGENTS)
    .where(_AGENTS.c.host_id == bindparam("host"))
    .values(agent_run=bindparam("run"), last_seen_at=bindparam("at"))
)
_LISTED = (
    update(_AGENTS)
    .where(_AGENTS.c.host_id == bindparam("host"))
    .values(listed_run=bindparam("run"), last_seen_at=bindparam("at"))
)
