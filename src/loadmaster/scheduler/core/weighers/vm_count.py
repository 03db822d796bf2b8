"""VM count (oVirt's even guest distribution): prefer hosts running fewer VMs, pending
ones included, whatever their size."""

from __future__ import annotations

from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Floats, Ints, Snapshot


class VmCountWeigher:
    name = "vm_count"
    host_local = True  # a candidate's score depends on its own row only
    reads = ()

    def weigh(self, hosts: Snapshot, request: VmRequest, candidates: Ints) -> Floats | None:
        return -hosts.vm_count[candidates].astype(float)
