"""Process settings a long-lived loadmaster process makes once it has loaded its state."""

from __future__ import annotations

import gc

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
