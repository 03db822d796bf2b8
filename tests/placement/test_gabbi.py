"""Placement's basic-fixture gabbi files against a live server: the pass count may only go
up. Raise ``AT_LEAST`` when a change passes more (``bash scripts/placement-gabbi.sh``)."""

from __future__ import annotations

from gabbi_suite import run_all, table

# Issue #12's starting point was 78 of 535; Placement itself passes 532.
AT_LEAST = 534


def test_placement_gabbits_pass_count_never_drops() -> None:
    results = run_all()
    print("\n" + table(results))
    passed = sum(r.passed for r in results)
    assert sum(r.total for r in results) >= 535, "fewer gabbi tests found than Placement ships"
    assert passed >= AT_LEAST, f"{passed} gabbi tests pass, fewer than {AT_LEAST}"
