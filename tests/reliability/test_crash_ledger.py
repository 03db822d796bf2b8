"""kill -9 a claiming process at random points: every VM is fully claimed or not at all.

A worker process places VMs in claim_many batches and brings some of them up. The test
kills it with SIGKILL at a random moment, audits the database, starts a new worker that
carries on, and repeats. Whatever the moment of death, the audit is clean.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import random
import signal
from multiprocessing.synchronize import Event as EventType

import pytest

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.errors import InsufficientCapacity
from loadmaster.pending import Claim, audit

HOSTS = 20
VMS = 600


def _worker(url: str, seed: int, mid_work: EventType | None = None) -> None:
    """Places VMs until none is left. ``mid_work`` is set just before a randomly chosen
    batch's claim starts: the test kills the process the moment it sees it, so the kill
    lands inside real work however slow the machine is (no guessed sleep)."""
    rng = random.Random(seed)
    lm = loadmaster.open(url, migrate=False)
    hosts = [f"h{i}" for i in range(HOSTS)]
    signal_at = rng.randrange(1, 6)
    for batch_no in itertools.count(1):
        waiting = [vm.uuid for vm in lm.vms.list(state="requested")]
        if not waiting:
            return
        batch = waiting[:10]
        claims = [Claim(vm, rng.choice(hosts)) for vm in batch]
        if mid_work is not None and batch_no == signal_at:
            mid_work.set()
        try:
            lm.allocations.claim_many(claims, all_or_nothing=rng.random() < 0.5)
        except InsufficientCapacity:
            continue  # a gang that did not fit wrote nothing; try other hosts
        for vm in lm.vms.list(state="pending")[:10]:
            lm.allocations.activate(vm.uuid)


def _setup(url: str) -> None:
    with loadmaster.open(url) as lm:
        for i in range(HOSTS):
            lm.hosts.create(
                f"h{i}", inventories={"VCPU": {"total": 64}, "MEMORY_MB": {"total": 65536}}
            )
        lm.flavors.create({"name": "f", "resources": {"VCPU": 2, "MEMORY_MB": 2048}})
        lm.vms.create_many([VmSpec(f"vm{i}", "f") for i in range(VMS)])


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"]
)
def test_kill_nine_mid_batch_leaves_no_partial_claim(
    backend: str, request: pytest.FixtureRequest, tmp_path: object
) -> None:
    url = (
        request.getfixturevalue("pg_url")
        if backend == "postgres"
        else f"sqlite:///{tmp_path}/crash.db"
    )
    _setup(url)
    ctx = mp.get_context("spawn")
    kills = 0
    for round_ in range(8):
        mid_work = ctx.Event()
        proc = ctx.Process(target=_worker, args=(url, round_, mid_work))
        proc.start()
        mid_work.wait(timeout=120)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.join(timeout=60)
        with loadmaster.open(url, migrate=False) as lm:
            assert audit(lm.store) == [], f"after kill {kills}"
    assert kills >= 3, "the worker finished before it could be killed; the test proved nothing"
    # A last worker, left alone, carries on to the end.
    proc = ctx.Process(target=_worker, args=(url, 99))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    with loadmaster.open(url, migrate=False) as lm:
        assert audit(lm.store) == []
        assert lm.vms.list(state="requested") == []
        placed = len(lm.vms.list(state="pending")) + len(lm.vms.list(state="running"))
        assert placed == VMS
