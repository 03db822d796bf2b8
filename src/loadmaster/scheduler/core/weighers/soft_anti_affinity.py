"""Soft anti-affinity: prefer hosts holding fewer members of the VM's group (pending too)."""

from __future__ import annotations

from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Floats, Ints, Snapshot


class SoftAntiAffinityWeigher:
    name = "soft_anti_affinity"
    host_local = True  # a candidate's score depends on its own row only
    reads = ("group",)

    def weigh(self, hosts: Snapshot, request: VmRequest, candidates: Ints) -> Floats | None:
        group = request.group
        if group is None or group.policy != "soft-anti-affinity":
            return None
        return -hosts.group_members[group.name][candidates].astype(float)
