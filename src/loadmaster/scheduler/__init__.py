"""The scheduler: where VMs run. A pure core (``decide`` over a read-only ``Snapshot``),
filters and weighers (plugins), named policies, batch and gang placement over the
pending-aware ledger, explanations and capacity questions."""

from loadmaster.scheduler.core.decide import Decision, FilterResult, LoadedPolicy, decide
from loadmaster.scheduler.core.plugins import (
    HostFilter,
    HostView,
    MaskFilter,
    Verdict,
    Weigher,
    WeigherSetting,
)
from loadmaster.scheduler.core.policies import DEFAULT_POLICY, POLICIES, Policy
from loadmaster.scheduler.core.request import RequestSpec, VmRequest
from loadmaster.scheduler.core.results import (
    CapacityReport,
    Explanation,
    FilterCount,
    HostScore,
    NoHostFits,
    Placement,
    ScheduleResult,
)
from loadmaster.scheduler.core.snapshot import Snapshot, SyntheticHost
from loadmaster.scheduler.reports import check_measures, record_report
from loadmaster.scheduler.scheduler import Scheduler

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CapacityReport",
    "Decision",
    "Explanation",
    "FilterCount",
    "FilterResult",
    "HostFilter",
    "HostScore",
    "HostView",
    "LoadedPolicy",
    "MaskFilter",
    "NoHostFits",
    "Placement",
    "Policy",
    "RequestSpec",
    "ScheduleResult",
    "Scheduler",
    "Snapshot",
    "SyntheticHost",
    "Verdict",
    "VmRequest",
    "Weigher",
    "WeigherSetting",
    "check_measures",
    "decide",
    "record_report",
]
