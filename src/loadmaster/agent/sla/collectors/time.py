"""Time: the host's local date and time (MOM's HostTime)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from loadmaster.agent.sla.collectors.base import CollectorSources, HostCollector, Stats
from loadmaster.policy.entities import HOST_TIME_STATS
from loadmaster.policy.snapshot import StatValue


class HostTimeCollector:
    """MOM's HostTime: the local date and time, for policies that act by time of day."""

    name = "host-time"
    fields: tuple[str, ...] = HOST_TIME_STATS
    mandatory_fields = fields

    def __init__(self, now: Callable[[], datetime] = datetime.now) -> None:
        self.now = now

    def collect(self, guests: Sequence[Mapping[str, StatValue]]) -> Stats:
        t = self.now()
        values = (t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond)
        return dict(zip(self.fields, values, strict=True))


def host_time(src: CollectorSources) -> HostCollector:
    return HostTimeCollector()
