"""Hard anti-affinity: at most ``max_per_host`` members (default 1) per host, pending
members counted like running ones, so a mass start never doubles up."""

from __future__ import annotations

from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Ints, Snapshot


class AntiAffinityFilter:
    name = "anti_affinity"
    order = 60
    dynamic = True
    reads = ("group",)

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        return self.mask_at(hosts, request, None)

    def mask_at(self, hosts: Snapshot, request: VmRequest, at: Ints | None) -> Verdict | None:
        group = request.group
        if group is None or group.policy != "anti-affinity":
            return None
        limit = group.max_per_host or 1
        members = hosts.group_members[group.name]
        return Verdict.one_reason(
            (members if at is None else members[at]) < limit, f"anti-affinity(group {group.name})"
        )
