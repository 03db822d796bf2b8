"""Loading policy files the way MOM does, and running one all-or-nothing cycle."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from loadmaster.policy.entities import GUEST_STATS, HOST_STATS, Entity, declared_stats
from loadmaster.policy.errors import PolicyError, PolicyLimitError
from loadmaster.policy.evaluator import DEFAULT_MAX_STEPS, Evaluator, global_scope
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot
from loadmaster.policy.syntax import Node, parse
from loadmaster.policy.values import Value

SNAPSHOT = "<snapshot>"
# The shipped policies take a few hundred steps per guest; a budget that grows with the
# guest count keeps big hosts working while a runaway policy still stops within seconds.
STEPS_PER_GUEST = 5_000
# A cycle of the shipped policies takes milliseconds; the agent's interval is 10 s.
DEFAULT_MAX_SECONDS = 5.0
# vdsm's whole mom.d is under 10 KiB; the cap keeps a stray file from filling memory.
MAX_POLICY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class PolicyFile:
    """One parsed file; ``name`` is MOM's policy name (the file name cut at ``.policy``)."""

    name: str
    filename: str
    program: tuple[Node, ...]
    # SHA-256 of the file's bytes: tells a new version of a file from the one running.
    digest: str = ""


def policy_name(filename: str) -> str:
    """MOM's rule: ``02-balloon.policy`` is named ``02-balloon``; ``x.policy.policy`` is ``x``."""
    cut = filename.find(".policy")
    return filename if cut < 0 else filename[:cut]


def read_policy_bytes(path: Path) -> bytes:
    """The file's bytes, refusing without blocking anything but a regular file.

    Opened non-blocking: a FIFO named ``x.policy`` would otherwise block the agent until
    some writer appeared. The type is checked on the open descriptor, so a file swapped
    for a FIFO between a listing and the read is refused too.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise PolicyError(path.name, 0, 0, f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise PolicyError(path.name, 0, 0, f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise PolicyError(path.name, 0, 0, "not a regular file; refused")
    if info.st_size > MAX_POLICY_BYTES:
        os.close(fd)
        raise PolicyError(path.name, 0, 0, f"larger than {MAX_POLICY_BYTES} bytes; refused")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(MAX_POLICY_BYTES + 1)
        except OSError as exc:
            raise PolicyError(path.name, 0, 0, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyError(path.name, 0, 0, f"larger than {MAX_POLICY_BYTES} bytes; refused")
    return data


def decode_policy(path: Path, data: bytes) -> str:
    """The file as text; a byte that is not UTF-8 is an error at its own line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start].decode("utf-8", errors="replace")
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        raise PolicyError(
            path.name, line, column, f"byte 0x{data[exc.start]:02x} is not UTF-8"
        ) from None


def parse_policy_bytes(path: Path, data: bytes) -> PolicyFile:
    """One file's bytes as a ``PolicyFile``; raises ``PolicyError`` at file:line:col."""
    program = parse(decode_policy(path, data), path.name)
    digest = hashlib.sha256(data).hexdigest()
    return PolicyFile(policy_name(path.name), path.name, program, digest)


def parse_file(path: str | PathLike[str]) -> PolicyFile:
    file_path = Path(path)
    return parse_policy_bytes(file_path, read_policy_bytes(file_path))


class Policy:
    """A set of policy files evaluated, in name order, as one program every cycle."""

    def __init__(
        self,
        files: Iterable[PolicyFile],
        max_steps: int | None = None,
        max_seconds: float | None = DEFAULT_MAX_SECONDS,
    ) -> None:
        by_name = {f.name: f for f in files}
        self.files: tuple[PolicyFile, ...] = tuple(by_name[n] for n in sorted(by_name))
        self.max_steps = max_steps
        self.max_seconds = max_seconds

    @classmethod
    def from_text(cls, text: str, filename: str = "policy.policy") -> Policy:
        return cls([PolicyFile(policy_name(filename), filename, parse(text, filename))])

    def evaluate(self, host: EntitySnapshot, guests: Sequence[EntitySnapshot]) -> CycleResult:
        """Run one cycle. Any error raises ``PolicyError`` and no control is returned.

        One exception, so that one guest's missing statistic never costs the others their
        controls: when the error is raised while evaluating a guest (inside ``with
        Guests``) that read a statistic which came back nil, that guest is left out
        (``CycleResult.left_out``) and the cycle evaluated again without it. MOM drops
        the whole tick there. An error on a complete guest is the policy's own fault and
        fails the cycle as in MOM; so does any bound exceeded. All evaluations of one
        cycle share one wall-time deadline.
        """
        seen: set[str] = set()
        for guest in guests:
            if guest.name in seen:
                raise PolicyError(SNAPSHOT, 0, 0, f"two guests are named {guest.name!r}")
            seen.add(guest.name)
        deadline = None if self.max_seconds is None else time.monotonic() + self.max_seconds
        left_out: dict[str, str] = {}
        io_refused: dict[str, str] = {}
        while True:
            remaining = [g for g in guests if g.name not in left_out]
            try:
                return self._evaluate_once(host, remaining, deadline, left_out, io_refused)
            except PolicyLimitError:
                raise
            except PolicyError as exc:
                culprit = exc.subject
                if not isinstance(culprit, Entity):
                    raise
                # Read a limit key its IO policy lacks (MOM drops the tick): only that
                # guest's IO tune is refused, and the cycle evaluated again without it.
                io_problem = culprit.io_tune_absent_read()
                if io_problem is not None:
                    io_refused[culprit.snapshot.name] = io_problem
                    continue
                if not culprit.missing:
                    raise
                missing = ", ".join(sorted(culprit.missing))
                left_out[culprit.snapshot.name] = f"policy failed on its nil {missing}: {exc}"

    def _evaluate_once(
        self,
        host: EntitySnapshot,
        guests: Sequence[EntitySnapshot],
        deadline: float | None,
        left_out: Mapping[str, str],
        io_refused: Mapping[str, str],
    ) -> CycleResult:
        # Collectors' declarations decide what is readable; snapshots without one (policy
        # eval) share MOM's full field list plus whatever any of them carries.
        host_declared = host.declared
        if host_declared is None:
            host_declared = declared_stats(HOST_STATS, [host])
        host_entity = Entity(host, host_declared)
        fallback = declared_stats(GUEST_STATS, [g for g in guests if g.declared is None])
        guest_entities = [
            Entity(g, fallback if g.declared is None else g.declared, io_refused.get(g.name))
            for g in guests
        ]

        steps = self.max_steps
        if steps is None:
            steps = DEFAULT_MAX_STEPS + STEPS_PER_GUEST * len(guests)
        guest_values: list[Value] = list(guest_entities)
        evaluator = Evaluator(
            global_scope(host_entity, guest_values),
            steps,
            max_seconds=self.max_seconds,
            deadline=deadline,
        )
        evaluator.run(node for f in self.files for node in f.program)

        guest_controls: dict[str, dict[str, Value]] = {}
        missing_guest: dict[str, tuple[str, ...]] = {}
        refused: dict[str, dict[str, str]] = {}
        for entity in guest_entities:
            if entity.io_tune_refused is not None:
                refused[entity.snapshot.name] = {"io_tune": entity.io_tune_refused}
            controls = dict(entity.controls)
            io_request = entity.io_tune_control()
            if io_request is not None:
                controls["io_tune"] = io_request
            if controls:
                guest_controls[entity.snapshot.name] = controls
            if entity.missing:
                missing_guest[entity.snapshot.name] = tuple(sorted(entity.missing))
        return CycleResult(
            host_controls=dict(host_entity.controls),
            guest_controls=guest_controls,
            missing_host_stats=tuple(sorted(host_entity.missing)),
            missing_guest_stats=missing_guest,
            refused_controls=refused,
            left_out=dict(left_out),
        )


def load_policy_files(paths: Iterable[str | PathLike[str]]) -> Policy:
    """Parse the given files; they run in name order, a later file of the same name wins."""
    return Policy([parse_file(p) for p in paths])


def policy_dir_files(directory: str | PathLike[str]) -> list[Path]:
    """MOM's ``policy-dir`` rule: every ``*.policy`` file that is not a dot-file, sorted."""
    root = Path(directory)
    if not root.is_dir():
        raise PolicyError(str(root), 0, 0, "not a directory")
    return sorted(
        p for p in root.iterdir() if p.name.endswith(".policy") and not p.name.startswith(".")
    )


def load_policy_dir(directory: str | PathLike[str]) -> Policy:
    """All of a directory's policy files, or ``PolicyError`` for the first that fails.
    ``PolicyDirectory`` is the tolerant form the agent runs."""
    return load_policy_files(policy_dir_files(directory))


class PolicyDirectory:
    """A policy directory loaded file by file, as MOM's ``policy-dir``: one file that
    cannot be used is reported and the others run.

    Each file is tracked on its own. On a reload a file that fails (syntax error at
    file:line:col, unreadable, not a regular file, too big) keeps its previous version
    running, if it had one; a new file that fails is left out. ``reject`` does the same
    for a version that exceeded an evaluation bound at run time, falling back to the last
    version of that file that completed a cycle (``cycle_succeeded``). A refused version is
    not tried again until the file's bytes change.
    """

    def __init__(
        self,
        directory: str | PathLike[str],
        max_steps: int | None = None,
        max_seconds: float | None = DEFAULT_MAX_SECONDS,
    ) -> None:
        self.directory = Path(directory)
        self.max_steps = max_steps
        self.max_seconds = max_seconds
        self.running: dict[str, PolicyFile] = {}
        self.proven: dict[str, PolicyFile] = {}
        self.errors: dict[str, PolicyError] = {}
        self._refused: dict[str, str] = {}
        self.policy = Policy([], max_steps, max_seconds)

    def reload(self) -> bool:
        """Read the directory again; True when the set of running file versions changed."""
        paths = policy_dir_files(self.directory)
        running: dict[str, PolicyFile] = {}
        errors: dict[str, PolicyError] = {}
        for path in paths:
            previous = self.running.get(path.name)
            try:
                running[path.name] = self._load_one(path, previous)
            except PolicyError as exc:
                errors[path.name] = exc
                if previous is not None:
                    running[path.name] = previous
        self._refused = {n: d for n, d in self._refused.items() if n in errors}
        self.errors = errors
        return self._install(running)

    def _load_one(self, path: Path, previous: PolicyFile | None) -> PolicyFile:
        try:
            data = read_policy_bytes(path)
        except PolicyError:
            self._refused[path.name] = ""
            raise
        digest = hashlib.sha256(data).hexdigest()
        if previous is not None and previous.digest == digest:
            return previous
        earlier = self.errors.get(path.name)
        if earlier is not None and self._refused.get(path.name) == digest:
            raise earlier
        self._refused[path.name] = digest
        parsed = parse_policy_bytes(path, data)
        del self._refused[path.name]
        return parsed

    def reject(self, error: PolicyError) -> bool:
        """Stop running the version of ``error.file`` that raised it; True when the policy
        changed (the caller may evaluate again)."""
        current = self.running.get(error.file)
        if current is None:
            return False
        self._refused[error.file] = current.digest
        self.errors[error.file] = error
        running = dict(self.running)
        fallback = self.proven.get(error.file)
        if fallback is not None and fallback.digest != current.digest:
            running[error.file] = fallback
        else:
            del running[error.file]
        return self._install(running)

    def cycle_succeeded(self) -> None:
        """The running versions completed a cycle: they are what ``reject`` falls back to."""
        self.proven = dict(self.running)

    @property
    def digest(self) -> str:
        """SHA-256 over the running files' names and contents."""
        digest = hashlib.sha256()
        for filename in sorted(self.running):
            digest.update(f"{filename}\0{self.running[filename].digest}\0".encode())
        return digest.hexdigest()

    def _install(self, running: dict[str, PolicyFile]) -> bool:
        if {n: f.digest for n, f in running.items()} == {
            n: f.digest for n, f in self.running.items()
        }:
            return False
        self.running = running
        self.policy = Policy(running.values(), self.max_steps, self.max_seconds)
        return True


def shipped_policy_dir() -> Path:
    """The policies loadmaster ships (balloon, KSM, CPU and IO tune, SLA tiers)."""
    return Path(__file__).resolve().parent / "shipped"
