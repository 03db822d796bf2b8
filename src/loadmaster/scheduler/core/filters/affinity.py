"""Hard affinity: once a member of the group is placed (pending counts), the others follow.

The first member of a batch carries the rest as ``companions`` into the resources filter,
so the host it lands on has room for the whole group.
"""

from __future__ import annotations

from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Snapshot


class AffinityFilter:
    name = "affinity"
    order = 60
    dynamic = True

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        group = request.group
        if group is None or group.policy != "affinity":
            return None
        members = hosts.group_members[group.name]
        if not members.any():
            return None
        return Verdict.one_reason(members > 0, f"affinity(group {group.name})")
