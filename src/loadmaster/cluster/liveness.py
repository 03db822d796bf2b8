"""When a host's agent counts as live: the one rule the scheduler's filter, ``host show``,
drains, waiting claims and evacuation all apply, so they never disagree about a host.

Times are seconds since the epoch (the server's clock); the rule takes one host or a numpy
array of them. A host with no agent is None (one host) or NaN (array), never live.

A deployment *uses agents* once any host has one registered; until then no host is held
against its missing agent (the scheduling API alone, Placement clients, simulations).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import overload

import numpy as np
import numpy.typing as npt

# Seconds without a word from a host's agent before it is silent (``agent_silent_after``).
DEFAULT_SILENT_AFTER_S = 60.0


@overload
def agent_live(last_seen: float | None, at: float, silent_after: float) -> bool: ...
@overload
def agent_live(
    last_seen: npt.NDArray[np.float64], at: float, silent_after: float
) -> npt.NDArray[np.bool_]: ...
def agent_live(
    last_seen: float | npt.NDArray[np.float64] | None, at: float, silent_after: float
) -> bool | npt.NDArray[np.bool_]:
    """Was an agent last heard from at ``last_seen`` still live at ``at``: heard from
    within ``silent_after`` seconds (a stamp a little ahead of ``at`` counts as live)."""
    if last_seen is None:
        return False
    live = np.less_equal(at - last_seen, silent_after)
    return live if isinstance(live, np.ndarray) else bool(live)


def epoch(stamp: datetime) -> float:
    """A timestamp column's value (naive UTC) as seconds since the epoch."""
    return stamp.replace(tzinfo=UTC).timestamp()


def utc_text(seconds: float) -> str:
    """A time for operators: ISO 8601 with its zone."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Silence:
    """A host whose agent cannot act: none registered (``since`` None), or silent since
    ``since`` (when it was last heard from, naive UTC)."""

    host: str
    since: datetime | None

    def describe(self) -> str:
        if self.since is None:
            return f"host {self.host} has no agent"
        return f"the agent of host {self.host} is silent since {utc_text(epoch(self.since))}"
