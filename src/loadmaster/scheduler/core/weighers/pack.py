"""Pack (power saving): prefer the host that is fullest after placing the VM, per class,
normalised to each host's capacity, so big and small hosts compare fairly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Floats, Ints, Snapshot


def utilisation(
    hosts: Snapshot,
    request: VmRequest,
    candidates: Ints,
    classes: Mapping[str, float] | None,
) -> Floats | None:
    """Weighted mean over classes of (used + this VM) / capacity on each candidate; the
    classes default to the ones the VM asks for, weighted equally."""
    weights = classes or dict.fromkeys(request.resources, 1.0)
    total = np.zeros(len(candidates))
    weight_sum = 0.0
    for name, weight in weights.items():
        column = hosts.classes.get(name)
        if column is None:
            continue
        total += weight * hosts.share(column, request.resources.get(name, 0), candidates)
        weight_sum += weight
    return total / weight_sum if weight_sum else None


def _weights(classes: Mapping[str, float] | Sequence[str] | None) -> dict[str, float] | None:
    if classes is None:
        return None
    if isinstance(classes, Mapping):
        return {str(k): float(v) for k, v in classes.items()}
    return {str(name): 1.0 for name in classes}


class PackWeigher:
    name = "pack"
    host_local = True  # a candidate's score depends on its own row only
    reads = ("resources",)

    def __init__(self, classes: Mapping[str, float] | Sequence[str] | None = None) -> None:
        self.classes = _weights(classes)

    def weigh(self, hosts: Snapshot, request: VmRequest, candidates: Ints) -> Floats | None:
        return utilisation(hosts, request, candidates, self.classes)
