"""The data a policy cycle reads and writes: the contract between agent and policy engine.

Collectors build one ``EntitySnapshot`` for the host and one per guest; the engine
evaluates the policy over them and returns a ``CycleResult``; controllers apply it.
Neither side knows how the other is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, with_config

from loadmaster.shapes import Name


# A stat is a finite number, or None for one a collector could not read; never a bool
# (``true`` in a snapshot is a mistake, not 1).
def _finite_number(value: object) -> object:
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        raise ValueError(f"must be a finite number or null, got {value!r}")
    return value


StatValue = Annotated[int | float | None, BeforeValidator(_finite_number)]


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class EntitySnapshot:
    """One entity (the host, or one guest) as the collectors saw it this cycle.

    ``stats`` is the latest sample (``Host.mem_free`` in a policy); ``history`` holds the
    retained samples, oldest first, the latest included, for ``StatAvg``. ``properties``
    are static facts (``Prop "name"``); ``tags`` carry the SLA tier (platinum, gold, ...).
    A stat a collector could not read is ``None``.

    ``declared`` is the set of fields the configured collectors declare (MOM's mandatory
    and optional fields): exactly those are readable, a declared field absent from
    ``stats`` reads nil and any other name is an undefined symbol, as in MOM. ``None``
    (a snapshot not built by collectors, e.g. ``policy eval``) declares every field MOM's
    collectors know plus those the snapshots carry.
    """

    name: Name
    stats: Mapping[str, StatValue]
    history: tuple[Mapping[str, StatValue], ...] = ()
    properties: Mapping[str, Any] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    declared: frozenset[str] | None = None


@dataclass(frozen=True)
class CycleResult:
    """Controls one successful cycle recorded: ``host_controls`` and, per guest name, its controls.

    ``missing_host_stats`` / ``missing_guest_stats`` name the stats the policy read this
    cycle that came back nil (not collected, or no sample in the history), so the agent
    can report a broken collector instead of silently running with less data. Guests
    without controls or missing stats are left out of the mappings.

    ``refused_controls`` maps a guest name to the controls refused for it and why (its
    ``io_tune`` when the policy read a limit key its IO policy entry lacks); the policy ran
    without them and every other control stands. ``left_out`` maps a guest the cycle
    was evaluated without to the reason: the policy failed on a statistic it lacked.
    """

    host_controls: Mapping[str, Any]
    guest_controls: Mapping[str, Mapping[str, Any]]
    missing_host_stats: tuple[str, ...] = ()
    missing_guest_stats: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    refused_controls: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    left_out: Mapping[str, str] = field(default_factory=dict)
