"""The two entry points the CLI calls: checking policy files and evaluating them on JSON."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from os import PathLike
from typing import Any

from loadmaster import shapes
from loadmaster.errors import ValidationError
from loadmaster.policy.engine import SNAPSHOT, Policy, parse_file
from loadmaster.policy.errors import PolicyError
from loadmaster.policy.lint import lint
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot


def _fail(where: str, message: str) -> PolicyError:
    return PolicyError(SNAPSHOT, 0, 0, f"{where}: {message}")


def _entity(raw: Any, where: str, default_name: str | None) -> EntitySnapshot:
    if not isinstance(raw, Mapping):
        raise _fail(where, "expected an object")
    defaults: dict[str, Any] = (
        {"stats": {}}
        if default_name is None
        else {
            "stats": {},
            "name": default_name,
        }
    )
    try:
        entity = shapes.parse(EntitySnapshot, {**defaults, **raw}, where)
    except ValidationError as exc:
        raise PolicyError(SNAPSHOT, 0, 0, exc.detail) from None
    io_tune = entity.properties.get("io_tune")
    if io_tune is not None and not (
        isinstance(io_tune, list) and all(isinstance(e, Mapping) for e in io_tune)
    ):
        raise _fail(f"{where}.properties.io_tune", "expected a list of objects")
    return entity


def snapshot_from_json(data: Any) -> tuple[EntitySnapshot, list[EntitySnapshot]]:
    """Host and guests from the snapshot JSON documented in ``loadmaster.policy``: each
    entity in ``EntitySnapshot``'s own shape, checked against its declaration."""
    if not isinstance(data, Mapping):
        raise _fail("snapshot", "expected an object with 'host' and 'guests'")
    host = _entity(data.get("host", {}), "host", "host")
    guests_raw = data.get("guests", [])
    if not isinstance(guests_raw, list):
        raise _fail("guests", "expected a list")
    guests = [_entity(g, f"guests[{i}]", None) for i, g in enumerate(guests_raw)]
    return host, guests


def result_to_json(result: CycleResult) -> dict[str, Any]:
    return {
        "host": dict(result.host_controls),
        "guests": {name: dict(c) for name, c in result.guest_controls.items()},
        "missing_stats": {
            "host": list(result.missing_host_stats),
            "guests": {name: list(s) for name, s in result.missing_guest_stats.items()},
        },
        "left_out": dict(result.left_out),
        "refused": {name: dict(c) for name, c in result.refused_controls.items()},
    }


def check_files(paths: Iterable[str | PathLike[str]]) -> list[PolicyError]:
    """Every problem found without running the policy: syntax errors, then shape errors.

    Each file is checked on its own, so one broken file does not hide another's problems.
    """
    problems: list[PolicyError] = []
    parsed = []
    for path in paths:
        try:
            parsed.append(parse_file(path))
        except PolicyError as exc:
            problems.append(exc)
    for policy_file in Policy(parsed).files:
        problems.extend(lint(policy_file.program))
    return problems


def eval_files(paths: Iterable[str | PathLike[str]], snapshot_json: Any) -> dict[str, Any]:
    """Run one cycle of the given files on a JSON snapshot; raises ``PolicyError`` on failure."""
    policy = Policy([parse_file(p) for p in paths])
    host, guests = snapshot_from_json(snapshot_json)
    return result_to_json(policy.evaluate(host, guests))
