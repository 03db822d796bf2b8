"""``max_per_host`` of a soft group is still a hard cap: a preference for sharing (or not)
never puts more than N members on one host. (Hard anti-affinity applies it itself.)"""

from __future__ import annotations

from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Ints, Snapshot


class MaxPerHostFilter:
    name = "max_per_host"
    order = 60
    dynamic = True
    reads = ("group",)

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        return self.mask_at(hosts, request, None)

    def mask_at(self, hosts: Snapshot, request: VmRequest, at: Ints | None) -> Verdict | None:
        group = request.group
        if group is None or group.max_per_host is None or group.policy == "anti-affinity":
            return None
        members = hosts.group_members[group.name]
        return Verdict.one_reason(
            (members if at is None else members[at]) < group.max_per_host,
            f"max-per-host(group {group.name}: {group.max_per_host})",
        )
