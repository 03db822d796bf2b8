"""Process settings a long-lived loadmaster process makes once it has loaded its state."""

from __future__ import annotations

import gc
import time
from typing import Any

# Young objects collected after this many allocations instead of CPython's 700: a mass
# start allocates half a million containers, and each collection walks the survivors.
_YOUNG_COLLECTION_AFTER = 10_000


def settle_heap() -> None:
    """What was loaded so far (modules, the scheduler's snapshot) lives as long as the
    process: out of the collector's sight, a full collection no longer walks it mid-request,
    and the young generation is collected ten times less often: a mass start spends a
    tenth of the time it did in the collector (docs/architecture.md has the figures)."""
    gc.freeze()
    gc.set_threshold(_YOUNG_COLLECTION_AFTER, 50, 100)


class GcPauses:
    """The garbage collector's pauses in this process, timed by ``gc.callbacks``: how
    many, their total and the longest, and how many within each of ``BUCKETS`` seconds.
    Plain counters only: a collection may start anywhere, even inside a lock a metric
    library would take."""

    BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.longest_s = 0.0
        self.within = [0] * len(self.BUCKETS)
        self._started = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        # Collections never overlap: each runs holding the interpreter's lock.
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.count += 1
        self.total_s += took
        self.longest_s = max(self.longest_s, took)
        for i, bound in enumerate(self.BUCKETS):
            if took <= bound:
                self.within[i] += 1


_gc_pauses: GcPauses | None = None


def gc_pauses() -> GcPauses:
    """This process's ``GcPauses``, timing from the first call on."""
    global _gc_pauses
    if _gc_pauses is None:
        _gc_pauses = GcPauses()
        gc.callbacks.append(_gc_pauses)
    return _gc_pauses
