"""Dominant-resource balance: prefer hosts where, after placing the VM, the classes the VM
uses are filled evenly, so no host runs out of memory with CPUs to spare (kube's
BalancedAllocation, in DRF terms: keep the dominant share close to the others)."""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Floats, Ints, Snapshot


class BalanceWeigher:
    name = "balance"
    host_local = True  # a candidate's score depends on its own row only
    reads = ("resources",)

    def weigh(self, hosts: Snapshot, request: VmRequest, candidates: Ints) -> Floats | None:
        shares = [
            hosts.share(hosts.classes[name], amount, candidates)
            for name, amount in request.resources.items()
            if name in hosts.classes
        ]
        if len(shares) < 2:
            return None
        highest, lowest = shares[0], shares[0]
        for share in shares[1:]:
            highest = np.maximum(highest, share)
            lowest = np.minimum(lowest, share)
        return lowest - highest
