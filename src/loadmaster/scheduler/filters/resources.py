"""Resources fit: capacity minus active minus pending, per class, with the unit rules.

"One VM of this kind per host" needs no filter of its own: give each host a custom class
with total 1 (``CUSTOM_ONE_PER_HOST``) and the flavor a demand of 1.
"""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.plugins import Verdict
from loadmaster.scheduler.request import VmRequest
from loadmaster.scheduler.snapshot import Bools, Snapshot


class ResourcesFilter:
    name = "resources"
    order = 90
    dynamic = True

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict:
        checks: list[tuple[Bools, str]] = []
        for name in sorted(request.resources):
            column = hosts.classes.get(name)
            offered = hosts.offers(column) if column is not None else np.zeros(hosts.size, np.bool_)
            if not offered.all():
                checks.append((offered, f"no {name} inventory"))
        fits = hosts.fits(request.resources, request.companion_total)
        checks += [(ok, f"short of {name}") for name, ok in sorted(fits.items())]
        if request.one_numa_node:
            checks.append(
                (hosts.one_node_counts(request.resources) > 0, "no NUMA node with room for all")
            )
        return Verdict(checks, hosts.size)
