"""``max_per_host`` of a soft group is still a hard cap: a preference for sharing (or not)
never puts more than N members on one host. (Hard anti-affinity applies it itself.)"""

from __future__ import annotations

from loadmaster.cluster.records import GroupRecord
from loadmaster.scheduler.core.filters.group_cap import GroupCapFilter


class MaxPerHostFilter(GroupCapFilter):
    name = "max_per_host"

    def limit(self, group: GroupRecord) -> int | None:
        return None if group.policy == "anti-affinity" else group.max_per_host

    def reason(self, group: GroupRecord) -> str:
        return f"max-per-host(group {group.name}: {group.max_per_host})"
