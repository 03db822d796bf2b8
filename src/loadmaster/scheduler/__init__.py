"""The scheduler: where VMs run. Filters and weighers (plugins), named policies, batch and
gang placement over the pending-aware ledger, explanations and capacity questions."""

from loadmaster.scheduler.plugins import (
    HostFilter,
    HostView,
    MaskFilter,
    Verdict,
    Weigher,
    WeigherSetting,
)
from loadmaster.scheduler.policies import DEFAULT_POLICY, POLICIES, Policy
from loadmaster.scheduler.reports import record_report
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
from loadmaster.scheduler.state import HostState

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CapacityReport",
    "Explanation",
    "FilterCount",
    "HostFilter",
    "HostScore",
    "HostState",
    "HostView",
    "MaskFilter",
    "NoHostFits",
    "Placement",
    "Policy",
    "RequestSpec",
    "ScheduleResult",
    "Scheduler",
    "Verdict",
    "VmRequest",
    "Weigher",
    "WeigherSetting",
    "record_report",
]
