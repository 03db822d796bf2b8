"""Hard anti-affinity: at most ``max_per_host`` members (default 1) per host, pending
members counted like running ones, so a mass start never doubles up."""

from __future__ import annotations

from loadmaster.cluster.records import GroupRecord
from loadmaster.scheduler.core.filters.group_cap import GroupCapFilter


class AntiAffinityFilter(GroupCapFilter):
    name = "anti_affinity"

    def limit(self, group: GroupRecord) -> int | None:
        return (group.max_per_host or 1) if group.policy == "anti-affinity" else None

    def reason(self, group: GroupRecord) -> str:
        return f"anti-affinity(group {group.name})"
