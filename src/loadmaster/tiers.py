"""SLA tiers and priorities, read from VM tags: the one definition the API, the agent,
its policies, the simulator and the reports all use.

Tags (set through the API, carried to the host in the domain metadata)::

    platinum    the whole allocation is guaranteed: never ballooned
    gold        at least 75 % of the allocation is guaranteed
    silver      at least 50 % of the allocation is guaranteed
    compute     keeps all its CPU (no quota) while its memory is reclaimed hard
    vapor       nothing guaranteed; powered off when the host runs short of memory
                (``best-effort`` is an alias of ``vapor``)
    priority:N  N a whole number from 0 to 999, default 0. Within one tier, VMs of lower
                priority are reclaimed, asked to migrate and stopped before VMs of higher
                priority; across tiers the tier decides.

A VM carries at most one tier (the API refuses two); a host that still sees several
(metadata written by hand) uses the first in ``TIERS`` order, the strongest guarantee.
A VM without a tier tag is ``UNTIERED``: ballooned like any VM, never stopped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Tier:
    """``memory_guarantee``: fraction of the allocation the host never reclaims;
    ``stoppable``: powered off when resources are short; ``keeps_cpu``: never given a
    CPU quota below all of its vCPUs."""

    name: str
    memory_guarantee: float
    stoppable: bool = False
    keeps_cpu: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def tags(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


# Strongest guarantee first: the order in which a host resolves several tier tags.
TIERS: tuple[Tier, ...] = (
    Tier("platinum", 1.0),
    Tier("gold", 0.75),
    Tier("silver", 0.5),
    Tier("compute", 0.0, keeps_cpu=True),
    Tier("vapor", 0.0, stoppable=True, aliases=("best-effort",)),
)
UNTIERED = Tier("none", 0.0)
TIER_NAMES: tuple[str, ...] = tuple(t.name for t in TIERS)
_BY_TAG: dict[str, Tier] = {tag: t for t in TIERS for tag in t.tags}

PRIORITY_PREFIX = "priority:"
DEFAULT_PRIORITY = 0
MAX_PRIORITY = 999


def tier_named(tag: str) -> Tier | None:
    """The tier a single tag names (aliases included), or None."""
    return _BY_TAG.get(tag)


def tiers_in(tags: Iterable[str]) -> list[Tier]:
    """The distinct tiers the tags name, strongest first (an alias counts as its tier)."""
    named = {tier_named(tag) for tag in tags} - {None}
    return [t for t in TIERS if t in named]


def tier_of(tags: Iterable[str]) -> Tier:
    found = tiers_in(tags)
    return found[0] if found else UNTIERED


def parse_priority(tag: str) -> int | None:
    """N for a well-formed ``priority:N``; None for a tag that is not a priority tag.
    Raises ValueError for a priority tag whose N is not a whole number in 0..999."""
    if not tag.startswith(PRIORITY_PREFIX):
        return None
    text = tag[len(PRIORITY_PREFIX) :]
    # int() would also take "+3", " 3" and "3_0"; only plain digits are a priority.
    if not text.isdigit() or not text.isascii() or int(text) > MAX_PRIORITY:
        raise ValueError(
            f"{tag!r}: a priority is {PRIORITY_PREFIX}N with N a whole number "
            f"from 0 to {MAX_PRIORITY}"
        )
    return int(text)


def priority_of(tags: Iterable[str]) -> int:
    """The highest well-formed priority among the tags, else ``DEFAULT_PRIORITY``.
    Malformed priority tags are ignored here: the API refuses them, the host must not."""
    found = []
    for tag in tags:
        try:
            value = parse_priority(tag)
        except ValueError:
            continue
        if value is not None:
            found.append(value)
    return max(found, default=DEFAULT_PRIORITY)
