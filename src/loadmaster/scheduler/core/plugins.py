"""The extension points: filters and weighers, one small protocol each, found by entry point.

A **filter** keeps or rejects hosts and says why. It implements either

* ``mask(hosts, request) -> Verdict | None``: one numpy verdict over every host (fast;
  None means "this request does not concern me"), or
* ``filter(host, request) -> str | None``: one host at a time, returning the rejection
  reason or None to keep it (simple; the scheduler calls it for each remaining host).

Both get a read-only ``Snapshot`` (``snapshot.py``): a plugin can be tried, and tested, on
made-up hosts (``Snapshot.of``) with no database.

A filter whose answer can change while a batch is being decided (it reads usage or group
members) sets ``dynamic = True``. A static one (``dynamic = False``) may declare ``reads``:
the request fields its verdict depends on. Its verdicts are then cached per value of
those fields, as kube-scheduler caches per plugin, and it sees only those fields (reading
another fails, naming the filter, rather than answering from a stale cache). A static
filter that declares nothing is asked again for every request.

A dynamic mask filter whose verdict on a host depends only on that host's row of the
snapshot (its usage, VM count, group members) and on the request is **host-local**: it
declares ``reads`` and also implements ``mask_at(hosts, request, at) -> Verdict | None``,
the same checks (same reasons, same order) for the hosts ``at`` only. A batch then asks
``mask`` once per value of the fields it reads and, after each decision, ``mask_at`` for
the hosts that decision changed, instead of ``mask`` over every host for every VM. A
weigher is host-local the same way when its score for a candidate depends only on that
candidate: it sets ``host_local = True`` and declares ``reads``, and its raw scores are
kept per value of those fields and recomputed only on the hosts that changed. A
host-local plugin sees only the fields it declares, as a static filter does. Whether a
host-local plugin answers None (the request does not concern it, no opinion) must
depend on the request alone: a kept None is not asked again. Plugins that declare
neither are asked over every host (or candidate) for every request; either way the
decisions are the same (``decide(..., incremental=False)`` asks every plugin every time).
A large spreading batch is decided in rounds (``decide._decide_round``): a request that a
dynamic filter which is not host-local concerns (does not answer None) is decided alone,
and a weigher that is not host-local is asked once per request of the round.

A **weigher** scores candidate hosts: ``weigh(hosts, request, candidates) -> raw scores``
(higher is better, None for no opinion). The scheduler rescales the raw scores to [0, 1]
over the candidates, as Nova does, and multiplies them by the policy's multiplier.

Third parties register plugins without touching loadmaster, in their own pyproject::

    [project.entry-points."loadmaster.filters"]
    rack_power = "mypkg.filters:RackPowerFilter"

Every registered filter runs (each is a no-op for requests it does not concern); a
weigher runs when the policy in use gives it a multiplier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import numpy as np

from loadmaster.cluster.records import HOST_STATES
from loadmaster.errors import ValidationError
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Bools, Floats, Ints, Snapshot

FILTER_GROUP = "loadmaster.filters"
WEIGHER_GROUP = "loadmaster.weighers"


class Verdict:
    """A filter's answer for every host, as ``(ok, reason)`` checks: a host is kept when it
    passes them all, and a rejected host is blamed on the first check it fails. Blame is
    only worked out when an explanation is asked for, so 10,000 rejections cost no strings.
    """

    def __init__(self, checks: Sequence[tuple[Bools, str]], size: int) -> None:
        self.checks = tuple(checks)
        if not self.checks:
            self.keep: Bools = np.ones(size, np.bool_)
            return
        keep = np.array(self.checks[0][0], np.bool_)  # (a copy, whatever the check was)
        for ok, _ in self.checks[1:]:
            np.logical_and(keep, ok, out=keep)
        self.keep = keep

    @classmethod
    def one_reason(cls, keep: Bools, reason: str) -> Verdict:
        return cls([(keep, reason)], len(keep))

    def reason_at(self, host: int) -> str:
        """Why this one host is rejected: the first check it fails."""
        return next((reason for ok, reason in self.checks if not ok[host]), "")

    def blame(self, rejected: Bools) -> dict[str, int]:
        """How many of the ``rejected`` hosts each reason accounts for."""
        counts: dict[str, int] = {}
        left = rejected.copy()
        for ok, reason in self.checks:
            hit = int(np.count_nonzero(left & ~ok))
            if hit:
                counts[reason] = counts.get(reason, 0) + hit
                left &= ok
        return counts


@dataclass(frozen=True)
class FilterResult:
    """What one filter said about every host, under its name."""

    plugin: str
    verdict: Verdict


@dataclass(frozen=True)
class HostView:
    """One host as a per-host filter sees it."""

    name: str
    state: str
    traits: frozenset[str]
    aggregates: frozenset[str]
    capacity: Mapping[str, int]
    used: Mapping[str, int]
    vm_count: int
    group_members: int

    def free(self, resource_class: str) -> int:
        return self.capacity.get(resource_class, 0) - self.used.get(resource_class, 0)


@runtime_checkable
class MaskFilter(Protocol):
    name: str

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None: ...


@runtime_checkable
class LocalMaskFilter(Protocol):
    """A host-local mask filter (see the module docstring)."""

    name: str

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None: ...

    def mask_at(self, hosts: Snapshot, request: VmRequest, at: Ints) -> Verdict | None: ...


@runtime_checkable
class HostFilter(Protocol):
    name: str

    def filter(self, host: HostView, request: VmRequest) -> str | None: ...


@runtime_checkable
class Weigher(Protocol):
    name: str

    def weigh(self, hosts: Snapshot, request: VmRequest, candidates: Ints) -> Floats | None: ...


@dataclass(frozen=True)
class WeigherSetting:
    """One weigher in a policy: its multiplier and the options its factory takes."""

    name: str
    multiplier: float = 1.0
    options: Mapping[str, Any] = field(default_factory=dict)


def _load(group: str) -> dict[str, Callable[..., Any]]:
    return {ep.name: ep.load() for ep in entry_points(group=group)}


@dataclass(frozen=True)
class LoadedFilter:
    """A filter plugin and how to call it, worked out once (protocol checks are slow)."""

    name: str
    mask: MaskFilter | None
    per_host: HostFilter | None
    dynamic: bool
    order: int
    reads: frozenset[str] | None = None
    # Host-local (dynamic, declares reads, has mask_at): updated on the changed hosts only.
    local: LocalMaskFilter | None = None


def load_filters() -> list[LoadedFilter]:
    """Every registered filter, instantiated, in ``order`` (cheap, static ones first)."""
    found = _load(FILTER_GROUP)
    if "resources" not in found:
        raise RuntimeError(
            "loadmaster's filters are not registered: reinstall the package (pip install -e .)"
        )
    loaded = []
    for name, factory in found.items():
        plugin = factory()
        mask = plugin if isinstance(plugin, MaskFilter) else None
        per_host = plugin if isinstance(plugin, HostFilter) else None
        if mask is None and per_host is None:
            raise TypeError(f"filter plugin {name} has neither mask() nor filter()")
        dynamic = bool(getattr(plugin, "dynamic", True))
        reads = _reads(name, getattr(plugin, "reads", None))
        local = None
        if dynamic and reads is not None and isinstance(plugin, LocalMaskFilter):
            local = plugin
        loaded.append(
            LoadedFilter(
                plugin.name,
                mask,
                per_host,
                dynamic,
                int(getattr(plugin, "order", 50)),
                reads,
                local,
            )
        )
    return sorted(loaded, key=lambda f: (f.order, f.name))


def _reads(name: str, reads: object, kind: str = "filter") -> frozenset[str] | None:
    if reads is None:
        return None
    known = {f.name for f in fields(VmRequest)} | {"companion_total"}
    if isinstance(reads, str) or not isinstance(reads, Iterable):
        raise TypeError(f"{kind} plugin {name}: reads must be a list of VmRequest fields")
    unknown = sorted(str(r) for r in reads if r not in known)
    if unknown:
        raise TypeError(
            f"{kind} plugin {name}: reads names {unknown[0]!r}, not a VmRequest field "
            f"(known: {', '.join(sorted(known))})"
        )
    return frozenset(str(r) for r in reads)


def local_weigher(weigher: Weigher) -> frozenset[str] | None:
    """The request fields a host-local weigher reads (None: it is not host-local)."""
    if not getattr(weigher, "host_local", False):
        return None
    name = str(getattr(weigher, "name", type(weigher).__name__))
    return _reads(name, getattr(weigher, "reads", None), "weigher")


def load_weighers(settings: Sequence[WeigherSetting]) -> list[tuple[Weigher, float]]:
    found = _load(WEIGHER_GROUP)
    out = []
    for setting in settings:
        factory = found.get(setting.name)
        if factory is None:
            raise ValidationError(
                f"policy weigher {setting.name!r} is not registered "
                f"(known: {', '.join(sorted(found))})",
                field="policy",
            )
        if setting.multiplier:
            weigher = factory(**setting.options)
            local_weigher(weigher)  # a host-local weigher's reads name request fields
            out.append((weigher, setting.multiplier))
    return out


def host_view(hosts: Snapshot, host: int, request: VmRequest) -> HostView:
    rows = hosts.tree[host]
    traits: Bools = np.asarray(hosts.trait_matrix[rows].any(axis=0))
    aggregates: Bools = np.asarray(hosts.aggregate_matrix[rows].any(axis=0))
    members = hosts.group_members.get(request.group.name) if request.group is not None else None
    return HostView(
        name=hosts.names[host],
        state=HOST_STATES[int(hosts.status[rows[0]])],
        traits=frozenset(t for t, col in hosts.traits.items() if traits[col]),
        aggregates=frozenset(a for a, col in hosts.aggregates.items() if aggregates[col]),
        capacity={
            c: int(hosts.host_capacity[col, host])
            for c, col in hosts.classes.items()
            if hosts.host_capacity[col, host]
        },
        used={c: int(hosts.host_used[col, host]) for c, col in hosts.classes.items()},
        vm_count=int(hosts.vm_count[host]),
        group_members=int(members[host]) if members is not None else 0,
    )
