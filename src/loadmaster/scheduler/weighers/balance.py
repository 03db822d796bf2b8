"""Dominant-resource balance: prefer hosts where, after placing the VM, the classes the VM
uses are filled evenly, so no host runs out of memory with CPUs to spare (kube's
BalancedAllocation, in DRF terms: keep the dominant share close to the others)."""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.request import VmRequest
from loadmaster.scheduler.state import Floats, HostState, Ints


class BalanceWeigher:
    name = "balance"

    def weigh(self, hosts: HostState, request: VmRequest, candidates: Ints) -> Floats | None:
        names = [n for n in sorted(request.resources) if n in hosts.classes]
        columns = np.array([hosts.classes[n] for n in names], np.int64)
        if len(columns) < 2:
            return None
        capacity = hosts.host_capacity[np.ix_(candidates, columns)]
        amounts = np.array([request.resources[n] for n in names])
        used = hosts.host_used[np.ix_(candidates, columns)] + amounts
        shares = np.divide(used, capacity, out=np.ones(used.shape), where=capacity > 0)
        spread: Floats = shares.max(axis=1) - shares.min(axis=1)
        return -spread
