"""Resources fit: capacity minus active minus pending, per class, with the unit rules.

"One VM of this kind per host" needs no filter of its own: give each host a custom class
with total 1 (``CUSTOM_ONE_PER_HOST``) and the flavor a demand of 1.

Host-local: a host's verdict depends on its own tree's usage only, so a batch asks again
only for the hosts its last decisions changed (``mask_at``).
"""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.core.plugins import Verdict
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Bools, Ints, Snapshot


class ResourcesFilter:
    name = "resources"
    order = 90
    dynamic = True
    reads = (
        "resources",
        "companion_total",
        "one_numa_node",
        "pci_numa_affinity",
        "class_traits",
        "shared_held",
    )

    def mask(self, hosts: Snapshot, request: VmRequest) -> Verdict:
        return self.mask_at(hosts, request, None)

    def mask_at(self, hosts: Snapshot, request: VmRequest, at: Ints | None) -> Verdict:
        size = hosts.size if at is None else len(at)
        checks: list[tuple[Bools, str]] = []
        for name in sorted(request.resources):
            column = hosts.classes.get(name)
            if column is None:
                if hosts.size:  # (no host at all lacks it)
                    checks.append((np.zeros(size, np.bool_), f"no {name} inventory"))
            elif not hosts.offered_everywhere(column):
                offered = hosts.offers(column)
                checks.append((offered if at is None else offered[at], f"no {name} inventory"))
        fits = hosts.fits(request.resources, request.companion_total, at, request.shared_held)
        checks += [(ok, f"short of {name}") for name, ok in sorted(fits.items())]
        if request.one_numa_node:
            counts = hosts.one_node_counts(request.resources)
            checks.append(
                (counts > 0 if at is None else counts[at] > 0, "no NUMA node with room for all")
            )
        affinity = request.pci_numa_affinity
        if affinity is not None or request.class_traits:
            # Devices judged against the node the VM's CPUs and memory would take, or
            # the traits their provider must have: the whole tree-fit rule, asked only
            # of the hosts every other check keeps.
            hosts_at = np.arange(size) if at is None else at
            keep = (
                np.logical_and.reduce([ok for ok, _ in checks])
                if checks
                else np.ones(size, np.bool_)
            )
            near = np.zeros(size, np.bool_)
            for i in np.flatnonzero(keep).tolist():
                near[i] = bool(
                    hosts.placing(
                        int(hosts_at[i]),
                        hosts.unheld(int(hosts_at[i]), request.resources, request.shared_held),
                        request.one_numa_node,
                        affinity,
                        request.class_traits,
                    )
                )
            reason = (
                f"no NUMA node with room and its devices ({affinity})"
                if affinity is not None
                else "no provider with the traits its devices need has room"
            )
            checks.append((near | ~keep, reason))
        return Verdict(checks, size)
