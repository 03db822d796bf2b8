"""What happened in the demo, counted from the ledger's events (``VmService.events``):
every placement, launch, refused launch and retry, and every migration with its outcome.
A sampler reading the VMs every fraction of a second misses what begins and ends between
two reads; the events miss nothing that was committed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from loadmaster.cluster.records import VmEvent

# A placement: the VM was claimed on a host from nowhere.
_UNPLACED = ("requested", "stopped")


@dataclass
class Move:
    """One migration, from the event that began it to the one that ended it."""

    vm: str
    name: str
    tier: str
    why: str
    source: str
    destination: str
    began: float
    ended: float | None = None
    # done, rolled back, stopped, or in flight (it had not ended when the account closed)
    outcome: str = "in flight"
    fault: str | None = None


@dataclass
class Refusal:
    """A launch its host refused (or failed): the claim went and the VM was placed again,
    or not (``placed_again`` is None)."""

    vm: str
    name: str
    host: str
    at: float
    fault: str
    placed_again: str | None = None


@dataclass
class Account:
    placements: int = 0
    launches: int = 0
    # Pending VMs moved to another host before they ran (a drain re-places them).
    re_placed: int = 0
    refusals: list[Refusal] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)

    @property
    def retries(self) -> int:
        return sum(1 for r in self.refusals if r.placed_again is not None)

    def outcomes(self, why: str | None = None) -> dict[str, int]:
        """How the migrations (asked for ``why``, or all) ended, by outcome."""
        counts: dict[str, int] = {}
        for move in self.moves:
            if why is None or move.why == why:
                counts[move.outcome] = counts.get(move.outcome, 0) + 1
        return counts


def account(
    events: Iterable[VmEvent],
    origin: datetime,
    tiers: Mapping[str, str],
    drain: tuple[str, float] | None = None,
) -> Account:
    """``origin``: the moment the demo's clock reads 0 (events are placed on it in
    seconds); ``tiers``: each VM's tier by uuid; ``drain``: the drained host and when the
    drain began: a migration off it from then on is the drain's, any other the policy's."""
    result = Account()
    open_moves: dict[str, Move] = {}
    open_refusals: dict[str, Refusal] = {}
    for e in events:
        t = (e.at - origin).total_seconds()
        if e.old_state in _UNPLACED and e.state == "pending":
            result.placements += 1
            refused = open_refusals.pop(e.vm, None)
            if refused is not None:
                refused.placed_again = e.host
        elif e.old_state == "pending" and e.state == "pending":
            result.re_placed += 1
        elif e.old_state == "pending" and e.state == "running":
            result.launches += 1
        elif e.old_state == "pending" and e.state == "requested" and e.fault:
            refusal = Refusal(e.vm, e.name, e.old_host or "?", t, e.fault)
            result.refusals.append(refusal)
            open_refusals[e.vm] = refusal
        elif e.old_state == "running" and e.state == "migrating":
            source = e.old_host or "?"
            why = (
                "drain" if drain is not None and source == drain[0] and t >= drain[1] else "policy"
            )
            move = Move(e.vm, e.name, tiers.get(e.vm, "none"), why, source, e.target or "?", t)
            result.moves.append(move)
            open_moves[e.vm] = move
        elif e.old_state == "migrating" and e.vm in open_moves:
            move = open_moves.pop(e.vm)
            move.ended = t
            move.fault = e.fault
            if e.state != "running":
                move.outcome = e.state
            elif e.host == move.destination:
                move.outcome = "done"
            else:
                move.outcome = "rolled back"
    return result
