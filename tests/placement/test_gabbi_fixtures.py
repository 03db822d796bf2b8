"""Placement's data-fixture gabbi files (SharedStorageFixture, GranularFixture, ...: the
20 files whose data ``gabbi_fixtures.py`` builds over HTTP) against a live server: the
pass count may only go up. Raise ``AT_LEAST`` when a change passes more
(``bash scripts/placement-gabbi.sh --set fixtures``); docs/placement.md lists each
failure and why."""

from __future__ import annotations

import time

from gabbi_suite import run_all, table

# Issue #25's starting point was 175 of 322.
AT_LEAST = 321


def test_placement_fixture_gabbits_pass_count_never_drops() -> None:
    started = time.monotonic()
    results = run_all(data_fixtures=True)
    print(f"\n{table(results)}\n({time.monotonic() - started:.0f} s)")
    passed = sum(r.passed for r in results)
    assert len(results) == 20, "fewer data-fixture gabbi files found than Placement ships"
    assert sum(r.total for r in results) >= 322, "fewer gabbi tests found than Placement ships"
    assert passed >= AT_LEAST, f"{passed} gabbi tests pass, fewer than {AT_LEAST}"
