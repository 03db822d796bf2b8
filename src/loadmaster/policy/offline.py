"""``policy eval``: one policy cycle on a JSON snapshot, answered as the agent would.

With a collector selection (``--collectors vdsm``), the agent's readiness model is
applied to the snapshot as ``loop.Agent`` applies it to what its collectors read: only
the fields the collectors declare are readable; a host sample lacking a mandatory field
skips the tick (no control at all); a guest sample lacking one is left out as not
ready; and ``StatAvg`` sees only the samples of the history the agent would have
accepted, the last ``DEFAULT_HISTORY`` of them. Without one, every field MOM's
collectors know is readable and nothing is left out for readiness
(``loadmaster.policy.eval_files``).

Either way, a guest the policy asks both to ``stop`` and to ``migrate`` is given the
one the agent's controllers carry out (``controllers.stop_or_migrate``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from os import PathLike
from typing import Any

from loadmaster.agent.sla.collectors import (
    DEFAULT_HISTORY,
    PROPERTY_FIELDS,
    Declaration,
    declarations,
)
from loadmaster.agent.sla.controllers import stop_or_migrate
from loadmaster.policy.engine import load_policy_files
from loadmaster.policy.jsonio import result_to_json, snapshot_from_json
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot


def _as_collected(
    entity: EntitySnapshot, declaration: Declaration
) -> tuple[EntitySnapshot, str | None]:
    """The entity as the agent's collectors would give it, and why it is not ready."""
    stats = {k: v for k, v in entity.stats.items() if k not in PROPERTY_FIELDS}
    history = entity.history or (entity.stats,)
    accepted = tuple(s for s in history if declaration.unready(s, entity.properties) is None)
    # An agent keeps the last DEFAULT_HISTORY of them (its command line cannot change that).
    accepted = accepted[-DEFAULT_HISTORY:]
    collected = dataclasses.replace(
        entity, stats=stats, history=accepted, declared=declaration.fields
    )
    return collected, declaration.unready(stats, entity.properties)


def evaluate_snapshot(
    paths: Iterable[str | PathLike[str]], snapshot_json: Any, collectors: str | None = None
) -> dict[str, Any]:
    """The ``policy eval`` result: ``eval_files``'s JSON plus ``tick_skipped`` (why the
    agent would skip this tick, or null) and ``stop_or_migrate`` (per guest asked both,
    which wins and why). Raises ``PolicyError`` for a policy or snapshot fault and
    ``ValueError`` for an unknown collector selection."""
    policy = load_policy_files(paths)
    host, guests = snapshot_from_json(snapshot_json)
    not_ready: dict[str, str] = {}
    skipped: str | None = None
    if collectors is not None:
        host_declaration, guest_declaration = declarations(collectors)
        host, host_unready = _as_collected(host, host_declaration)
        if host_unready is not None:
            skipped = f"host not ready: {host_unready}"
        ready = []
        for guest in guests:
            collected, unready = _as_collected(guest, guest_declaration)
            if unready is None:
                ready.append(collected)
            else:
                not_ready[guest.name] = f"not ready: {unready}"
        guests = ready
    result = CycleResult({}, {}) if skipped is not None else policy.evaluate(host, guests)
    out = result_to_json(result)
    out["left_out"] = {**not_ready, **out["left_out"]}
    out["tick_skipped"] = skipped
    tags = {g.name: g.tags for g in guests}
    decided = {n: stop_or_migrate(c, tags[n]) for n, c in result.guest_controls.items()}
    out["stop_or_migrate"] = {name: why for name, why in decided.items() if why is not None}
    return out
