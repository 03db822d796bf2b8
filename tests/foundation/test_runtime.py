"""``settle_heap``: what a serving process does once it has loaded its state."""

from __future__ import annotations

import subprocess
import sys


def test_settling_the_heap_freezes_what_was_loaded_and_collects_the_young_less_often() -> None:
    # In a process of its own: the test runner's collector is left as it is.
    probe = (
        "import gc, loadmaster.runtime as r; before = gc.get_freeze_count(); "
        "r.settle_heap(); print(before, gc.get_freeze_count(), gc.get_threshold()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    before, after, young = map(int, out)
    assert before == 0 and after > 1000
    assert young == 10_000
