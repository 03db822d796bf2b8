"""The applied-controls journal: what the agent did to the host, durable across kill -9.

An append-only JSON-lines file, ``applied.jsonl`` in the agent's state directory. Each
policy cycle that reaches the controllers is framed::

    {"kind": "cycle-start", "cycle": 7, "policy": "<sha256 of the policy files>", "time": ...}
    {"kind": "applied", "cycle": 7, "controller": "balloon", "target": "vm-1",
     "uuid": "...", "control": "balloon_target", "value": 3984588, "time": ...}
    {"kind": "cycle-end", "cycle": 7, "actions": 1, "failures": 0, "time": ...}

What the cycle did *not* do is journalled too, with its reason, so the journal alone
explains a guest whose controls stopped changing::

    {"kind": "left-out", "cycle": 7, "target": "vm-2", "uuid": "...",
     "reason": "not ready: mandatory vcpu_count missing", "time": ...}
    {"kind": "not-applied", "cycle": 7, "target": "vm-3", "uuid": "...", "control": "io_tune",
     "reason": "io_tune entry 'vda': maximum lacks the limit key write_iops_sec", "time": ...}

A ``not-applied`` record with target and control ``*`` means no control at all was applied
that cycle (the policy failed); target ``host`` with control ``*`` means the tick was
skipped because the host's sample was incomplete. These records are not framed by
cycle-start/cycle-end (a skipped cycle never reaches the controllers) and a compaction
drops them: they explain, they are not state.

An ``applied`` line is written only after the hypervisor call returned, and every line is
fsync'd before the agent makes its next call. So whenever the agent dies, the journal is
behind the hypervisor by at most the one call in flight, and never ahead of it: nothing
is recorded as applied that was not. A cycle-start with no cycle-end after it is an
*interrupted* cycle (or, while an agent runs, the one in progress).

A record cut short by the death of its writer (no newline at the end, or a last line that
does not parse) is ignored by ``read_journal`` and cut off when the journal is next opened.
On open, a journal larger than ``compact_bytes`` is rewritten to the last state of every
(target, control) and the interrupted cycles seen so far, via a temporary file, fsync and
``os.replace``, so it stays bounded however long the agent runs.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadmaster.agent.sla.controllers import Action
from loadmaster.errors import LoadmasterError

log = logging.getLogger(__name__)

JOURNAL_FILE = "applied.jsonl"
LOCK_FILE = "agent.lock"
DEFAULT_COMPACT_BYTES = 1024 * 1024
# How many interrupted cycles a compaction carries over: enough to notice a pattern.
KEEP_INTERRUPTED = 50


class JournalError(LoadmasterError):
    code = "loadmaster.journal_error"
    title = "Agent journal unusable"
    status = 500


@dataclass(frozen=True)
class AppliedRecord:
    """One control the hypervisor accepted. ``uuid`` is None for host-wide controls (KSM)."""

    cycle: int
    controller: str
    target: str
    uuid: str | None
    control: str
    value: Any
    time: float

    @property
    def key(self) -> tuple[str, str]:
        """What the record is the state of: VM names can be reused, their UUIDs cannot."""
        return (self.uuid or self.target, self.control)


@dataclass
class CycleInfo:
    cycle: int
    policy: str
    started: float
    applied: int = 0


@dataclass
class JournalState:
    """What a journal says: the last applied value of every (target, control), keyed by
    ``AppliedRecord.key``, and the cycles that started but never ended, oldest first.
    ``open_cycle`` is the last of those when the journal ends inside it: interrupted,
    unless an agent is running that cycle now (``agent_running``)."""

    last: dict[tuple[str, str], AppliedRecord] = field(default_factory=dict)
    interrupted: list[CycleInfo] = field(default_factory=list)
    open_cycle: CycleInfo | None = None
    cycles_ended: int = 0
    # left-out and not-applied records read (since the last compaction).
    explained: int = 0
    torn_bytes: int = 0
    # Where the last complete record ends: the length a torn tail is cut back to.
    valid_bytes: int = 0


def _applied(data: Mapping[str, Any]) -> AppliedRecord:
    return AppliedRecord(
        cycle=int(data["cycle"]),
        controller=str(data["controller"]),
        target=str(data["target"]),
        uuid=None if data.get("uuid") is None else str(data["uuid"]),
        control=str(data["control"]),
        value=data["value"],
        time=float(data["time"]),
    )


def _carried(data: Mapping[str, Any]) -> CycleInfo:
    return CycleInfo(
        int(data["cycle"]), str(data["policy"]), float(data["started"]), int(data["applied"])
    )


def parse_journal(raw: bytes) -> JournalState:
    """The state a journal's bytes describe. Raises ``JournalError`` for a damaged record
    before the last one: that is not a torn write, and guessing past it would lie."""
    state = JournalState()
    open_cycle: CycleInfo | None = None
    complete, _, tail = raw.rpartition(b"\n")
    lines = complete.split(b"\n") if complete else []
    for number, line in enumerate(lines, 1):
        try:
            data = json.loads(line)
            kind = data["kind"]
            if kind == "applied":
                record = _applied(data)
                state.last[record.key] = record
                if open_cycle is not None:
                    open_cycle.applied += 1
            elif kind == "cycle-start":
                started = CycleInfo(int(data["cycle"]), str(data["policy"]), float(data["time"]))
                if open_cycle is not None:
                    state.interrupted.append(open_cycle)
                open_cycle = started
            elif kind == "cycle-end":
                open_cycle = None
                state.cycles_ended += 1
            elif kind == "compacted":
                state.interrupted += [_carried(c) for c in data["interrupted"]]
            elif kind in ("left-out", "not-applied"):
                if not isinstance(data["target"], str) or not isinstance(data["reason"], str):
                    raise ValueError(f"{kind} record without a target and a reason")
                state.explained += 1
            else:
                raise ValueError(f"unknown record kind {kind!r}")
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines) and not tail:
                break  # a last line that does not parse is a torn write too
            raise JournalError(f"journal line {number} is damaged: {exc}") from exc
        state.valid_bytes += len(line) + 1
    if open_cycle is not None:
        state.interrupted.append(open_cycle)
        state.open_cycle = open_cycle
    state.torn_bytes = len(raw) - state.valid_bytes
    return state


def read_journal(state_dir: Path) -> JournalState:
    """The journal in ``state_dir`` as it is now (an empty state when there is none)."""
    try:
        raw = (Path(state_dir) / JOURNAL_FILE).read_bytes()
    except FileNotFoundError:
        return JournalState()
    except OSError as exc:
        raise JournalError(f"cannot read the journal in {state_dir}: {exc}") from exc
    return parse_journal(raw)


def agent_running(state_dir: Path) -> bool:
    """True while an agent holds the journal in ``state_dir`` open."""
    try:
        fd = os.open(Path(state_dir) / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _compacted_lines(state: JournalState, now: float) -> list[dict[str, Any]]:
    header = {
        "kind": "compacted",
        "time": now,
        "interrupted": [asdict(c) for c in state.interrupted[-KEEP_INTERRUPTED:]],
    }
    records = sorted(state.last.values(), key=lambda r: (r.time, r.key))
    return [header] + [{"kind": "applied", **asdict(r)} for r in records]


def _encode(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n").encode()


class AppliedJournal:
    """The writing end, held by one agent at a time (a lock in the state directory makes a
    second agent on the same directory fail to start rather than interleave records)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        compact_bytes: int = DEFAULT_COMPACT_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(state_dir)
        self.path = self.directory / JOURNAL_FILE
        self.clock = clock
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise JournalError(f"cannot use state directory {self.directory}: {exc}") from exc
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise JournalError(
                f"another agent is using the state directory {self.directory}"
            ) from None
        try:
            self.state_at_open = self._recover(compact_bytes)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._size = os.fstat(self._fd).st_size
            _fsync_dir(self.directory)
        except OSError as exc:
            os.close(self._lock)
            raise JournalError(f"cannot open the journal {self.path}: {exc}") from exc

    def _recover(self, compact_bytes: int) -> JournalState:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return JournalState()
        try:
            state = parse_journal(raw)
        except JournalError as exc:
            # Never destroy evidence, and never refuse to control the host over it.
            aside = self.path.with_name(f"{JOURNAL_FILE}.damaged-{int(self.clock())}")
            log.error("%s; moved to %s, starting a new journal", exc, aside)
            os.replace(self.path, aside)
            return JournalState()
        if state.torn_bytes:
            log.warning("journal %s: dropping a torn last record", self.path)
            with open(self.path, "r+b") as f:
                f.truncate(state.valid_bytes)
                os.fsync(f.fileno())
        if state.valid_bytes > compact_bytes:
            self._compact(state)
        return state

    def _compact(self, state: JournalState) -> None:
        temporary = self.path.with_name(f".{JOURNAL_FILE}.compacting")
        with open(temporary, "wb") as f:
            f.write(b"".join(_encode(line) for line in _compacted_lines(state, self.clock())))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        _fsync_dir(self.directory)

    def close(self) -> None:
        os.close(self._fd)
        os.close(self._lock)

    def _append(self, record: Mapping[str, Any]) -> None:
        line = _encode(record)
        try:
            written = 0
            while written < len(line):
                written += os.write(self._fd, line[written:])
            os.fsync(self._fd)
        except OSError as exc:
            # A half-written line followed by more records would make the journal unreadable.
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                log.exception("journal %s: cannot cut back a failed write", self.path)
            raise JournalError(f"cannot write the journal {self.path}: {exc}") from exc
        self._size += len(line)

    def cycle_start(self, cycle: int, policy_digest: str) -> None:
        self._append(
            {"kind": "cycle-start", "cycle": cycle, "policy": policy_digest, "time": self.clock()}
        )

    def applied(self, cycle: int, action: Action) -> None:
        """Record a control the hypervisor has already accepted; never call it before."""
        self._append({"kind": "applied", "cycle": cycle, **asdict(action), "time": self.clock()})

    def left_out(self, cycle: int, target: str, uuid: str | None, reason: str) -> None:
        """A guest the cycle did not give to the policy (not ready), and why."""
        self._append(
            {
                "kind": "left-out",
                "cycle": cycle,
                "target": target,
                "uuid": uuid,
                "reason": reason,
                "time": self.clock(),
            }
        )

    def not_applied(
        self, cycle: int, target: str, uuid: str | None, control: str, reason: str
    ) -> None:
        """A control the cycle did not apply (``*``: all of the target's), and why."""
        self._append(
            {
                "kind": "not-applied",
                "cycle": cycle,
                "target": target,
                "uuid": uuid,
                "control": control,
                "reason": reason,
                "time": self.clock(),
            }
        )

    def cycle_end(self, cycle: int, actions: int, failures: int) -> None:
        self._append(
            {
                "kind": "cycle-end",
                "cycle": cycle,
                "actions": actions,
                "failures": failures,
                "time": self.clock(),
            }
        )
