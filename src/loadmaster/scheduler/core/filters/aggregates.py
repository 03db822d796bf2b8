"""``member_of``: each list is any-of, the lists are AND-ed; forbidden aggregates keep out."""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Bools, Snapshot


def in_any(hosts: Snapshot, aggregates: frozenset[str]) -> Bools:
    columns = [hosts.aggregates[a] for a in aggregates if a in hosts.aggregates]
    if not columns:
        return np.zeros(hosts.size, np.bool_)
    return hosts.any_per_host(np.asarray(hosts.aggregate_matrix[:, columns].any(axis=1)))


class AggregatesFilter:
    name = "aggregates"
    order = 40
    dynamic = False
    reads = ("member_of", "forbidden_aggregates")

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        if not request.member_of and not request.forbidden_aggregates:
            return None
        checks = [
            (in_any(hosts, any_of), f"not in aggregate {'|'.join(sorted(any_of))}")
            for any_of in request.member_of
        ]
        checks += [
            (~in_any(hosts, frozenset({a})), f"in forbidden aggregate {a}")
            for a in sorted(request.forbidden_aggregates)
        ]
        return Verdict(checks, hosts.size)
