"""Shared helpers for the policy tests: run a snippet, build snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from loadmaster.policy import PolicyError, parse
from loadmaster.policy.entities import GUEST_STATS, HOST_STATS, Entity, declared_stats
from loadmaster.policy.evaluator import Evaluator, global_scope
from loadmaster.policy.snapshot import EntitySnapshot

FIXTURES = Path(__file__).parent / "fixtures"
# Policies written for these tests in the shape of MOM deployments (not vdsm's files).
MOM_SHAPED = FIXTURES / "mom-shaped"


def host(history: Sequence[dict[str, float | None]] = (), **stats: float | None) -> EntitySnapshot:
    return EntitySnapshot("host", stats, tuple(history))


def guest(
    name: str,
    tags: Sequence[str] = (),
    history: Sequence[dict[str, float | None]] = (),
    properties: dict[str, object] | None = None,
    **stats: float | None,
) -> EntitySnapshot:
    return EntitySnapshot(name, stats, tuple(history), properties or {}, frozenset(tags))


def value_of(
    text: str, host_snap: EntitySnapshot | None = None, guests: Sequence[EntitySnapshot] = ()
) -> object:
    """The value of the last top-level expression of ``text``."""
    host_snap = host_snap or host()
    host_entity = Entity(host_snap, declared_stats(HOST_STATS, [host_snap]))
    declared = declared_stats(GUEST_STATS, guests)
    evaluator = Evaluator(global_scope(host_entity, [Entity(g, declared) for g in guests]))
    result: object = None
    for node in parse(text, "t.policy"):
        result = evaluator.eval(node)
    return result


def error_of(text: str, **kwargs: object) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        value_of(text, **kwargs)  # type: ignore[arg-type]
    return info.value
