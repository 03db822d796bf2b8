"""``include_hosts`` / ``exclude_hosts``: the operator's explicit say (Nova's SameHost /
DifferentHost, oVirt's PinToHost)."""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Bools, Snapshot


def _marked(hosts: Snapshot, names: frozenset[str]) -> Bools:
    marked = np.zeros(hosts.size, np.bool_)
    marked[[hosts.index[n] for n in names if n in hosts.index]] = True
    return marked


# In an operator's words: they named a host (``vm start --host``) or are moving a VM.
NOT_ASKED_FOR = "not a host asked for"
EXCLUDED = "excluded (where the VM runs, or by the request)"


class HostListFilter:
    name = "hosts"
    order = 20
    dynamic = False
    reads = ("include_hosts", "exclude_hosts")

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        checks = []
        if request.include_hosts is not None:
            checks.append((_marked(hosts, request.include_hosts), NOT_ASKED_FOR))
        if request.exclude_hosts:
            checks.append((~_marked(hosts, request.exclude_hosts), EXCLUDED))
        return Verdict(checks, hosts.size) if checks else None
