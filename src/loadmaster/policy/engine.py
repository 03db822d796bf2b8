"""Loading policy files the way MOM does, and running one all-or-nothing cycle."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from loadmaster.policy.entities import GUEST_STATS, HOST_STATS, Entity, declared_stats
from loadmaster.policy.errors import PolicyError
from loadmaster.policy.evaluator import DEFAULT_MAX_STEPS, Evaluator, global_scope
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot
from loadmaster.policy.syntax import Node, parse
from loadmaster.policy.values import Fault, Value

SNAPSHOT = "<snapshot>"
# The shipped policies take a few hundred steps per guest; a budget that grows with the
# guest count keeps big hosts working while a runaway policy still stops within seconds.
STEPS_PER_GUEST = 5_000


@dataclass(frozen=True)
class PolicyFile:
    """One parsed file; ``name`` is MOM's policy name (the file name cut at ``.policy``)."""

    name: str
    filename: str
    program: tuple[Node, ...]


def policy_name(filename: str) -> str:
    """MOM's rule: ``02-balloon.policy`` is named ``02-balloon``; ``x.policy.policy`` is ``x``."""
    cut = filename.find(".policy")
    return filename if cut < 0 else filename[:cut]


def read_policy_text(path: Path) -> str:
    """The file as text; a byte that is not UTF-8 is an error at its own line and column."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError(path.name, 0, 0, f"cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start].decode("utf-8", errors="replace")
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        raise PolicyError(
            path.name, line, column, f"byte 0x{data[exc.start]:02x} is not UTF-8"
        ) from None


def parse_file(path: str | PathLike[str]) -> PolicyFile:
    file_path = Path(path)
    text = read_policy_text(file_path)
    return PolicyFile(policy_name(file_path.name), file_path.name, parse(text, file_path.name))


class Policy:
    """A set of policy files evaluated, in name order, as one program every cycle."""

    def __init__(self, files: Iterable[PolicyFile], max_steps: int | None = None) -> None:
        by_name = {f.name: f for f in files}
        self.files: tuple[PolicyFile, ...] = tuple(by_name[n] for n in sorted(by_name))
        self.max_steps = max_steps

    @classmethod
    def from_text(cls, text: str, filename: str = "policy.policy") -> Policy:
        return cls([PolicyFile(policy_name(filename), filename, parse(text, filename))])

    def evaluate(self, host: EntitySnapshot, guests: Sequence[EntitySnapshot]) -> CycleResult:
        """Run one cycle. Any error raises ``PolicyError`` and no control is returned."""
        seen: set[str] = set()
        for guest in guests:
            if guest.name in seen:
                raise PolicyError(SNAPSHOT, 0, 0, f"two guests are named {guest.name!r}")
            seen.add(guest.name)
        try:
            host_entity = Entity(host, declared_stats(HOST_STATS, [host]))
            guest_declared = declared_stats(GUEST_STATS, guests)
            guest_entities = [Entity(g, guest_declared) for g in guests]
        except (Fault, TypeError, ValueError, AttributeError) as exc:
            raise PolicyError(SNAPSHOT, 0, 0, f"malformed io_tune property: {exc}") from None

        steps = self.max_steps
        if steps is None:
            steps = DEFAULT_MAX_STEPS + STEPS_PER_GUEST * len(guests)
        guest_values: list[Value] = list(guest_entities)
        evaluator = Evaluator(global_scope(host_entity, guest_values), steps)
        evaluator.run(node for f in self.files for node in f.program)

        guest_controls: dict[str, dict[str, Value]] = {}
        missing_guest: dict[str, tuple[str, ...]] = {}
        for entity in guest_entities:
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
    return load_policy_files(policy_dir_files(directory))


def shipped_policy_dir() -> Path:
    """The policies loadmaster ships (balloon, KSM, CPU and IO tune, SLA tiers)."""
    return Path(__file__).resolve().parent / "shipped"
