"""The scheduler: where VMs run. A pure core (``decide`` over a read-only ``Snapshot``),
filters and weighers (plugins), named policies, batch and gang placement over the
pending-aware ledger, explanations and capacity questions."""

from loadmaster.scheduler.decide import Decision, FilterResult, Plan, decide
from loadmaster.scheduler.plugins import (
    HostFilter,
    HostView,
    MaskFilter,
    Verdict,
    Weigher,
    WeigherSetting,
)
from loadmaster.scheduler.policies import DEFAULT_POLICY, POLICIES, Policy
from loadmaster.scheduler.reports import check_measures, record_report
from loadmaster.scheduler.request import RequestSpec, VmRequest
from loadmaster.scheduler.results import (
    CapacityReport,
    Explanation,
    FilterCount,
    HostScore,
    NoHostFits,
    Placement,
    ScheduleResult,
)
from loadmaster.scheduler.scheduler import Scheduler
from loadmaster.scheduler.snapshot import Snapshot, SyntheticHost

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
    "MaskFilter",
    "NoHostFits",
    "Placement",
    "Plan",
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
