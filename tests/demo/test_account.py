"""The demo's account from the ledger's events (issue 26), without running the demo: a
move that begins and ends between two samples still counts, a refused launch is counted
with its retry, and a VM no host took after a refusal is never said to have found one."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

from loadmaster.cluster.records import VmEvent
from loadmaster.demo.account import account
from loadmaster.demo.scenario import DemoResult
from loadmaster.report import render

ORIGIN = datetime(2026, 1, 1)
_ids = itertools.count(1)


def event(
    at: float,
    vm: str,
    change: str,
    hosts: tuple[str | None, str | None] = (None, None),
    targets: tuple[str | None, str | None] = (None, None),
    fault: str | None = None,
) -> VmEvent:
    old, new = change.split("->")
    return VmEvent(
        next(_ids),
        ORIGIN + timedelta(seconds=at),
        f"uuid-{vm}",
        vm,
        old,
        new,
        hosts[0],
        hosts[1],
        targets[0],
        targets[1],
        fault,
    )


EVENTS = [
    event(1.0, "a", "requested->pending", (None, "h1")),
    event(1.1, "a", "pending->requested", ("h1", None), fault="launch on h1 failed: no memory"),
    event(1.2, "a", "requested->pending", (None, "h2")),
    event(1.5, "a", "pending->running", ("h2", "h2")),
    event(1.0, "b", "requested->pending", (None, "h1")),
    event(1.3, "b", "pending->requested", ("h1", None), fault="launch on h1 failed: no memory"),
    event(1.0, "c", "requested->pending", (None, "h2")),
    event(1.4, "c", "pending->running", ("h2", "h2")),
    # Begun and done within 0.05 s: between two samples 0.2 s apart.
    event(5.00, "a", "running->migrating", ("h2", "h2"), (None, "h3")),
    event(5.05, "a", "migrating->running", ("h2", "h3"), ("h3", None)),
    event(6.0, "c", "running->migrating", ("h2", "h2"), (None, "h1")),
    event(6.5, "c", "migrating->running", ("h2", "h2"), ("h1", None), "migration on h2 failed"),
    event(9.0, "c", "running->migrating", ("h2", "h2"), (None, "h3")),
]


def test_every_placement_refusal_retry_and_migration_is_counted() -> None:
    acc = account(EVENTS, ORIGIN, {"uuid-a": "vapor"}, drain=("h2", 8.0))
    assert (acc.placements, acc.launches, acc.re_placed) == (4, 2, 0)
    assert [(r.name, r.host, r.placed_again) for r in acc.refusals] == [
        ("a", "h1", "h2"),
        ("b", "h1", None),
    ]
    assert acc.retries == 1
    assert [(m.name, m.why, m.source, m.destination, m.outcome) for m in acc.moves] == [
        ("a", "policy", "h2", "h3", "done"),
        ("c", "policy", "h2", "h1", "rolled back"),
        ("c", "drain", "h2", "h3", "in flight"),
    ]
    first = acc.moves[0]
    assert (first.tier, first.began, first.ended) == ("vapor", 5.0, 5.05)
    assert acc.moves[1].fault == "migration on h2 failed"
    assert acc.outcomes() == {"done": 1, "rolled back": 1, "in flight": 1}
    assert acc.outcomes("drain") == {"in flight": 1}


def test_a_vm_no_host_took_after_a_refusal_has_not_found_a_host() -> None:
    result = DemoResult(hosts=["h1", "h2", "h3"], vms=3)
    result.account = account(EVENTS, ORIGIN, {})
    page = render(result, "test", [])
    assert "every VM found a host" not in page
    assert "b: its launch was refused by h1, and no other host took it" in page
    assert '<table id="migrations">' in page and page.count("rolled back") >= 1

    result.account = account(EVENTS[:4], ORIGIN, {})
    page = render(result, "test", [])
    assert "every VM found a host, not always the first: 1 launches refused" in page
