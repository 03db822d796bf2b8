"""Only hosts that are up take new VMs: maintenance and down hosts are out."""

from __future__ import annotations

from loadmaster.cluster.records import HOST_STATES
from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import STATE_CODE, Snapshot


class HostStateFilter:
    name = "host_state"
    order = 10
    dynamic = False
    reads = ()

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict:
        status = hosts.host_status()
        checks = [(status != STATE_CODE[state], state) for state in HOST_STATES if state != "up"]
        return Verdict(checks, hosts.size)
