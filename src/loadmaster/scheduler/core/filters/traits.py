"""Required and forbidden traits (flavor plus request), anywhere in the host's tree."""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Bools, Snapshot


def has_trait(hosts: Snapshot, trait: str) -> Bools:
    column = hosts.traits.get(trait)
    if column is None:  # no host has it (yet)
        return np.zeros(hosts.size, np.bool_)
    return hosts.any_per_host(hosts.trait_matrix[:, column])


class TraitsFilter:
    name = "traits"
    order = 30
    dynamic = False
    reads = ("required_traits", "forbidden_traits")

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict | None:
        if not request.required_traits and not request.forbidden_traits:
            return None
        checks = [
            (has_trait(hosts, t), f"missing trait {t}") for t in sorted(request.required_traits)
        ]
        checks += [
            (~has_trait(hosts, t), f"has forbidden trait {t}")
            for t in sorted(request.forbidden_traits)
        ]
        return Verdict(checks, hosts.size)
