"""Only hosts whose agent is live take VMs, as Nova's ComputeFilter skips compute services
that are down: a VM placed on a host with no agent, or a silent one, would stay pending
(or half migrated) for ever. Nor do hosts whose host manager has (re)started and not yet
read its work list: it would learn of the VM only at its first read, however long that
takes, and an SLA loop's measurements say nothing of that.

A deployment uses agents once any host has one registered; until then (the scheduling
API alone, Placement clients, simulations) this filter keeps every host.
"""

from __future__ import annotations

import numpy as np

from loadmaster.cluster.liveness import agent_live, utc_text
from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Bools, Snapshot

NO_AGENT = "no agent"
SILENT = "agent silent"
UNLISTED = "its host manager has not read its work list since it started"


class LiveAgentVerdict(Verdict):
    """Blames a silent host on its silence since when, worked out only when asked."""

    def __init__(self, hosts: Snapshot, has_agent: Bools, live: Bools) -> None:
        super().__init__(
            [(has_agent, NO_AGENT), (live, SILENT), (hosts.agent_listed, UNLISTED)], hosts.size
        )
        self._seen = hosts.agent_seen

    def _since(self, host: int) -> str:
        return f"{SILENT} since {utc_text(float(self._seen[host]))}"

    def reason_at(self, host: int) -> str:
        reason = super().reason_at(host)
        return self._since(host) if reason == SILENT else reason

    def blame(self, rejected: Bools) -> dict[str, int]:
        counts = super().blame(rejected)
        if counts.pop(SILENT, 0):
            for host in np.flatnonzero(rejected & self.checks[0][0] & ~self.checks[1][0]):
                reason = self._since(int(host))
                counts[reason] = counts.get(reason, 0) + 1
        return counts


class LiveAgentFilter:
    name = "live_agent"
    order = 15
    dynamic = False
    reads = ()

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        if not hosts.agents_in_use:
            return None
        seen = hosts.agent_seen
        has_agent = ~np.isnan(seen)
        live = agent_live(seen, hosts.taken_at, hosts.agent_silent_after)
        return LiveAgentVerdict(hosts, has_agent, live)
