"""The scheduler's pure core: where each VM of a batch goes, decided from a read-only
``Snapshot`` of the hosts with no storage, ledger or network behind it (checked by
``tests/foundation/test_pure_core.py``).

``decide(snapshot, requests, policy, seed)`` runs a ``LoadedPolicy`` (a ``Policy`` from
``policies`` with its plugins built) over ``VmRequest``s: the filters (``filters/``,
``HostFilter``/``MaskFilter`` answering with a ``Verdict``) rule hosts out, the weighers
(``weighers/``) score the rest, and each request gets a ``Decision``; the same snapshot,
requests, policy and seed give the same decisions. ``explain`` and ``questions`` answer
why a host is ruled out and how many more VMs fit, from the same filters and weighers.
Plugins are registered as entry points (``loadmaster.filters``, ``loadmaster.weighers``)
and loaded by ``load_filters`` and ``load_weighers``."""

from loadmaster.scheduler.core.decide import Decision, FilterResult, LoadedPolicy, decide
from loadmaster.scheduler.core.plugins import (
    HostFilter,
    HostView,
    MaskFilter,
    Verdict,
    Weigher,
    load_filters,
    load_weighers,
)
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Snapshot, SyntheticHost

__all__ = [
    "Decision",
    "FilterResult",
    "HostFilter",
    "HostView",
    "LoadedPolicy",
    "MaskFilter",
    "Snapshot",
    "SyntheticHost",
    "Verdict",
    "VmRequest",
    "Weigher",
    "decide",
    "load_filters",
    "load_weighers",
]
