"""How often a server records a live agent, and the silence thresholds that follow from it.

Imported by the settings' checks, so it stays free of heavy imports.
"""

from __future__ import annotations

import re

# A server writes a live agent as heard at least this often (``agent_heard_every``): a
# long-poll it holds open counts once per this interval, and what was heard is written
# by a flush at most ``MAX_FLUSH_S`` (or the interval, if shorter) later.
DEFAULT_HEARD_EVERY_S = 10.0
MAX_FLUSH_S = 2.0


def flush_every(heard_every: float) -> float:
    """How often a server writes what it heard, given ``agent_heard_every``."""
    return min(MAX_FLUSH_S, heard_every)


def heard_gap(heard_every: float) -> float:
    """The longest a live agent's last word may be old in the database."""
    return heard_every + flush_every(heard_every)


def min_silent_after(heard_every: float) -> float:
    """The shortest safe silence threshold: twice ``heard_gap``. Once, so that a live
    agent never looks silent; twice, so that when agents fall silent together (a network
    cut), every one of them is already a suspect (``suspect_after``) by the time the
    first crosses the threshold, and the fleet rule sees them all at once."""
    return 2 * heard_gap(heard_every)


def suspect_after(silent_after: float, heard_every: float) -> float:
    """Seconds unheard after which a host counts among the fleet's silences though it is
    not yet past the threshold: longer than any live agent goes unrecorded, and half the
    threshold, so agents cut off within half a threshold of each other count together."""
    return max(heard_gap(heard_every), silent_after / 2)


# The header by which a long-poll of a host's work list says it is that host's agent.
AGENT_HEADER = "Loadmaster-Agent"
# The header by which a host's agent says which run of it speaks: a value drawn anew each
# time the agent's process starts. A host whose agent announced a run takes VMs only once
# that run has read the host's work list: a manager that has just (re)started holds no
# list, and a VM claimed there before its first read would wait on nobody.
AGENT_RUN_HEADER = "Loadmaster-Agent-Run"
_RUN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def valid_run(run: str) -> bool:
    """Whether ``run`` may be an agent's run: 1 to 64 letters, digits, '-' or '_'."""
    return _RUN.fullmatch(run) is not None


def polls_as_agent(bound: str | None, host: str, said: str | None) -> bool:
    """Whether a long-poll of ``host``'s work list counts as hearing from its agent, and so
    keeps the host live: the poller's token is bound to the host (``bound``), or the
    poller may act for any host (an admin, or anyone on a server without authentication:
    ``bound`` None) and says it is the host's agent (``said``, the ``AGENT_HEADER``). A
    watcher's poll is not the agent's: it would keep a dead host live and unfenced."""
    return bound == host or (bound is None and said == host)
