"""``include_hosts`` / ``exclude_hosts``: the operator's explicit say (Nova's SameHost /
DifferentHost, oVirt's PinToHost)."""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.plugins import Verdict
from loadmaster.scheduler.request import VmRequest
from loadmaster.scheduler.snapshot import Bools, Snapshot


def _marked(hosts: Snapshot, names: frozenset[str]) -> Bools:
    marked = np.zeros(hosts.size, np.bool_)
    marked[[hosts.index[n] for n in names if n in hosts.index]] = True
    return marked


class HostListFilter:
    name = "hosts"
    order = 20
    dynamic = False
    reads = ("include_hosts", "exclude_hosts")

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        checks = []
        if request.include_hosts is not None:
            checks.append((_marked(hosts, request.include_hosts), "not in include_hosts"))
        if request.exclude_hosts:
            checks.append((~_marked(hosts, request.exclude_hosts), "in exclude_hosts"))
        return Verdict(checks, hosts.size) if checks else None
