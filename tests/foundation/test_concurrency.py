"""Several OS processes claim against one small host at once: it ends exactly full, never over."""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time

import pytest

import loadmaster
from loadmaster.errors import ConcurrentUpdate, InsufficientCapacity, InvalidTransition
from loadmaster.pending import audit
from loadmaster.service import Loadmaster

SLOTS = 12  # the host holds exactly this many VMs
WORKERS = 4
VMS_PER_WORKER = 8  # 32 VMs race for 12 slots


def _claim_all(
    url: str, vm_uuids: list[str], start: mp.synchronize.Event, results: mp.Queue
) -> None:
    lm = loadmaster.open(url, migrate=False)
    start.wait()
    won = full = conflicts = 0
    for vm in vm_uuids:
        try:
            lm.allocations.claim(vm, "tiny-host")
            won += 1
        except InsufficientCapacity:
            full += 1
        except ConcurrentUpdate:
            conflicts += 1
    lm.close()
    results.put((won, full, conflicts))


def _race(url: str, lm: Loadmaster) -> list[tuple[int, int, int]]:
    lm.hosts.create(
        "tiny-host", inventories={"VCPU": {"total": SLOTS}, "MEMORY_MB": {"total": SLOTS * 1024}}
    )
    lm.flavors.create({"name": "one", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    uuids = [lm.vms.create(f"vm{i}", "one").uuid for i in range(WORKERS * VMS_PER_WORKER)]
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_claim_all, args=(url, uuids[i::WORKERS], start, results))
        for i in range(WORKERS)
    ]
    for p in procs:
        p.start()
    start.set()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return outcomes


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"]
)
def test_processes_fill_the_host_exactly(
    backend: str, request: pytest.FixtureRequest, tmp_path: object
) -> None:
    url = (
        request.getfixturevalue("pg_url")
        if backend == "postgres"
        else f"sqlite:///{tmp_path}/race.db"
    )
    with loadmaster.open(url) as lm:
        outcomes = _race(url, lm)
        assert sum(won for won, _, _ in outcomes) == SLOTS
        assert sum(won + full + c for won, full, c in outcomes) == WORKERS * VMS_PER_WORKER
        usage = lm.allocations.usages(["tiny-host"])["tiny-host"]
        assert usage["VCPU"].pending == SLOTS
        assert usage["VCPU"].free == 0
        assert usage["MEMORY_MB"].pending == SLOTS * 1024
        assert len(lm.vms.list(state="pending")) == SLOTS
        assert len(lm.allocations.allocations()) == 2 * SLOTS


@pytest.mark.postgres
def test_activate_racing_a_host_report_never_loses_an_update(pg_url: str) -> None:
    """A launcher says "up" while the host's report (listing nothing) is reconciled. Either
    may win, but never both: an activation that returned must not be undone into
    "requested" by a reconcile that decided on the state it had read before."""
    lm = loadmaster.open(pg_url)
    lm.hosts.create("h", inventories={"VCPU": {"total": 512}, "MEMORY_MB": {"total": 524288}})
    lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    vms = [lm.vms.create(f"v{i}", "f").uuid for i in range(120)]
    activated: dict[str, bool] = {}

    def launcher() -> None:
        for vm in vms:
            lm.allocations.claim(vm, "h")
            time.sleep(random.uniform(0, 0.01))  # a launch takes a while; reports go on
            try:
                lm.allocations.activate(vm)
                activated[vm] = True
            except InvalidTransition:
                activated[vm] = False

    def reporter(stop: threading.Event) -> None:
        while not stop.is_set():
            lm.allocations.reconcile("h", [])

    stop = threading.Event()
    report_thread = threading.Thread(target=reporter, args=(stop,))
    report_thread.start()
    try:
        launcher()
    finally:
        stop.set()
        report_thread.join()
    final = {vm.uuid: vm.state for vm in lm.vms.list()}
    for vm, ok in activated.items():
        assert final[vm] in (("running", "stopped") if ok else ("requested",)), (vm, ok, final[vm])
    assert 0 < sum(activated.values()) < len(vms), f"no race: {sum(activated.values())} up"
    assert audit(lm.store) == []
    lm.close()
