"""Soft anti-affinity: prefer hosts holding fewer members of the VM's group (pending too):
the mirror image of soft affinity."""

from __future__ import annotations

from loadmaster.scheduler.core.weighers.soft_affinity import SoftAffinityWeigher


class SoftAntiAffinityWeigher(SoftAffinityWeigher):
    name = "soft_anti_affinity"
    policy = "soft-anti-affinity"
    sign = -1.0
