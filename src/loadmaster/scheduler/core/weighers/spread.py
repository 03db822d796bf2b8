"""Spread (even distribution): prefer the emptiest host after placing the VM, per class,
normalised to capacity: the mirror image of pack."""

from __future__ import annotations

from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Floats, Ints, Snapshot
from loadmaster.scheduler.core.weighers.pack import PackWeigher, utilisation


class SpreadWeigher(PackWeigher):
    name = "spread"

    def weigh(self, hosts: Snapshot, request: VmRequest, candidates: Ints) -> Floats | None:
        used = utilisation(hosts, request, candidates, self.classes)
        return None if used is None else 1.0 - used
