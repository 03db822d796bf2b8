"""``max_per_host`` of a soft group is still a hard cap: a preference for sharing (or not)
never puts more than N members on one host. (Hard anti-affinity applies it itself.)"""

from __future__ import annotations

from loadmaster.scheduler.plugins import Verdict
from loadmaster.scheduler.request import VmRequest
from loadmaster.scheduler.snapshot import Snapshot


class MaxPerHostFilter:
    name = "max_per_host"
    order = 60
    dynamic = True

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        group = request.group
        if group is None or group.max_per_host is None or group.policy == "anti-affinity":
            return None
        return Verdict.one_reason(
            hosts.group_members[group.name] < group.max_per_host,
            f"max-per-host(group {group.name}: {group.max_per_host})",
        )
