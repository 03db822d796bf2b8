"""VM count (oVirt's even guest distribution): prefer hosts running fewer VMs, pending
ones included, whatever their size."""

from __future__ import annotations

from loadmaster.scheduler.request import VmRequest
from loadmaster.scheduler.state import Floats, HostState, Ints


class VmCountWeigher:
    name = "vm_count"

    def weigh(self, hosts: HostState, request: VmRequest, candidates: Ints) -> Floats | None:
        return -hosts.vm_count[candidates].astype(float)
