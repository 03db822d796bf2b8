"""Soft affinity: prefer hosts already holding members of the VM's group (pending too)."""

from __future__ import annotations

from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Floats, Ints, Snapshot


class SoftAffinityWeigher:
    name = "soft_affinity"
    host_local = True  # a candidate's score depends on its own row only
    reads = ("group",)
    # The groups weighed, and whether more members score higher (1) or lower (-1).
    policy = "soft-affinity"
    sign = 1.0

    def weigh(self, hosts: Snapshot, request: VmRequest, candidates: Ints) -> Floats | None:
        group = request.group
        if group is None or group.policy != self.policy:
            return None
        return self.sign * hosts.group_members[group.name][candidates].astype(float)
