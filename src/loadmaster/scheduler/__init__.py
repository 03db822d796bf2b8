"""The scheduler: where VMs run.

``core`` decides and does no I/O: filters and weighers over a read-only snapshot, named
policies, explanations and capacity questions. Around it sit the parts that read and
write: ``Scheduler`` (``scheduler.py``) answers the calls (``schedule``, ``start``,
``migrate``, ``explain``, ``capacity``), reading what the requests name (``resolve.py``)
against a snapshot kept current (``source.py``), running rounds of deciding and claiming
(``rounds.py``) through a committer that claims in the pending-aware ledger
(``commit.py``), deciding the calls that arrive together as one batch (``coalesce.py``)
and handing claims to the scheduling process when there is one (``remote.py``). The
policies by name are ``registry.py``'s; drains are ``drain.py``'s, agents' load reports
``reports.py``'s."""

from loadmaster.scheduler.core.plugins import WeigherSetting
from loadmaster.scheduler.core.policies import DEFAULT_POLICY, POLICIES, Policy
from loadmaster.scheduler.core.request import RequestSpec
from loadmaster.scheduler.core.results import (
    CapacityReport,
    Explanation,
    NoHostFits,
    Placement,
    ScheduleResult,
)
from loadmaster.scheduler.reports import check_measures
from loadmaster.scheduler.scheduler import Scheduler

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CapacityReport",
    "Explanation",
    "NoHostFits",
    "Placement",
    "Policy",
    "RequestSpec",
    "ScheduleResult",
    "Scheduler",
    "WeigherSetting",
    "check_measures",
]
