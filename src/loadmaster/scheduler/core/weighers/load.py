"""Measured load: prefer hosts whose agents report less load (the busiest dimension of the
latest report). Hosts that never reported count as average, neither punished nor favoured."""

from __future__ import annotations

import numpy as np

from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Floats, Ints, Snapshot


class LoadWeigher:
    name = "load"

    def weigh(self, hosts: Snapshot, request: VmRequest, candidates: Ints) -> Floats | None:
        if hosts.any_load is False:
            return None  # (no host reported any)
        load = hosts.load[candidates]
        known = ~np.isnan(load)
        if not known.any():
            return None
        return -np.where(known, load, load[known].mean())
