"""The hard per-host cap on a group's members that anti-affinity and ``max_per_host``
both enforce: pending members count like running ones, so a mass start never goes over."""

from __future__ import annotations

from loadmaster.cluster.records import GroupRecord
from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Ints, Snapshot


class GroupCapFilter:
    """A host-local filter keeping the hosts that hold fewer than ``limit(group)`` members
    of the request's group; a subclass says which groups it caps, how far, and why."""

    order = 60
    dynamic = True
    reads = ("group",)

    def limit(self, group: GroupRecord) -> int | None:
        """The cap for this group, or None when this filter does not concern it."""
        raise NotImplementedError

    def reason(self, group: GroupRecord) -> str:
        raise NotImplementedError

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        return self.mask_at(hosts, request, None)

    def mask_at(self, hosts: Snapshot, request: VmRequest, at: Ints | None) -> Verdict | None:
        group = request.group
        limit = None if group is None else self.limit(group)
        if group is None or limit is None:
            return None
        members = hosts.group_members[group.name]
        return Verdict.one_reason(
            (members if at is None else members[at]) < limit, self.reason(group)
        )
