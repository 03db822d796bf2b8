"""Soft affinity: prefer hosts already holding members of the VM's group (pending too)."""

from __future__ import annotations

from loadmaster.scheduler.request import VmRequest
from loadmaster.scheduler.state import Floats, HostState, Ints


class SoftAffinityWeigher:
    name = "soft_affinity"

    def weigh(self, hosts: HostState, request: VmRequest, candidates: Ints) -> Floats | None:
        group = request.group
        if group is None or group.policy != "soft-affinity":
            return None
        return hosts.group_members[group.name][candidates].astype(float)
