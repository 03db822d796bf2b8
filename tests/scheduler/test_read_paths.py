"""Dry runs are bounded and summarised, and read-only questions never wait behind a
claiming batch (issue 13, defect 8)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster.errors import ValidationError
from loadmaster.scheduler import RequestSpec
from loadmaster.scheduler.core.results import DRY_RUN_LISTED
from loadmaster.scheduler.scheduler import MAX_VMS_PER_CALL
from loadmaster.service import Loadmaster


def _finishes(call: Callable[[], object], seconds: float = 10.0) -> bool:
    done = threading.Event()

    def run() -> None:
        call()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


def test_reads_do_not_wait_behind_a_claiming_batch(slm: Loadmaster) -> None:
    add_hosts(slm, 3)
    small_flavor(slm)
    add_vms(slm, 2)
    scheduler = slm.scheduler
    with scheduler._lock:  # a batch is deciding and claiming: it holds the lock
        assert _finishes(lambda: scheduler.capacity("small"))
        assert _finishes(
            lambda: scheduler.schedule([RequestSpec(flavor="small", count=3)], dry_run=True)
        )
        assert _finishes(lambda: scheduler.explain(RequestSpec(flavor="small")))
        # A real placement does wait its turn.
        vm = slm.vms.list(state="requested")[0].uuid
        assert not _finishes(lambda: scheduler.schedule([RequestSpec(vms=[vm])]), 0.3)


def test_an_oversized_call_is_refused_naming_the_request(slm: Loadmaster) -> None:
    add_hosts(slm, 1)
    small_flavor(slm)
    too_many = [RequestSpec(flavor="small", count=MAX_VMS_PER_CALL), RequestSpec(flavor="small")]
    with pytest.raises(ValidationError) as err:
        slm.scheduler.schedule(too_many, dry_run=True)
    assert err.value.field == "requests[1]"


def test_a_big_dry_run_answers_with_a_summary(slm: Loadmaster) -> None:
    add_hosts(slm, 4, vcpu=64, memory=131072)
    small_flavor(slm)
    result = slm.scheduler.schedule([RequestSpec(flavor="small", count=500)], dry_run=True)
    body = result.to_dict()
    assert body["listed"] == DRY_RUN_LISTED == len(body["placements"])  # type: ignore[arg-type]
    by_host = body["by_host"]
    assert isinstance(by_host, dict)
    assert sum(by_host.values()) == body["placed"]
    assert body["placed"] + body["failed"] == 500  # type: ignore[operator]
    assert body["errors"] == (
        {"loadmaster.no_valid_host": body["failed"]} if body["failed"] else {}
    )
