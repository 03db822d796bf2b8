"""Two scheduler processes on one PostgreSQL race for the last slots: nothing overcommits,
and every VM is either placed or told why."""

from __future__ import annotations

import multiprocessing as mp
from collections import Counter

import pytest
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

import loadmaster
from loadmaster.pending import audit
from loadmaster.scheduler import RequestSpec

HOSTS = 6
SLOTS_PER_HOST = 4
VMS_PER_PROCESS = 20  # 40 VMs for 24 slots, plus an anti-affinity group split across both


def _schedule(url: str, vms: list[str], start: mp.synchronize.Event, out: mp.Queue) -> None:
    lm = loadmaster.open(url, migrate=False)
    lm.scheduler.refresh()
    start.wait()
    outcomes = []
    for chunk in range(0, len(vms), 5):
        result = lm.scheduler.schedule([RequestSpec(vms=vms[chunk : chunk + 5])])
        outcomes += [
            (p.vm, p.host, None if p.error is None else p.error.code) for p in result.placements
        ]
    lm.close()
    out.put(outcomes)


@pytest.mark.postgres
def test_two_schedulers_race_for_the_last_slots(pg_url: str) -> None:
    lm = loadmaster.open(pg_url)
    add_hosts(lm, HOSTS, vcpu=2 * SLOTS_PER_HOST, memory=65536)
    small_flavor(lm)
    lm.groups.create("apart", "anti-affinity")
    apart = add_vms(lm, 8, group="apart", prefix="a")
    plain = add_vms(lm, 2 * VMS_PER_PROCESS - 8)
    mine = [apart[0::2] + plain[0::2], apart[1::2] + plain[1::2]]
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_schedule, args=(pg_url, vms, start, out)) for vms in mine]
    for p in procs:
        p.start()
    start.set()
    outcomes = [row for _ in procs for row in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert sorted(vm for vm, _, _ in outcomes) == sorted(apart + plain)
    placed = [(vm, host) for vm, host, error in outcomes if host is not None]
    assert {error for _, _, error in outcomes} <= {
        None,
        "loadmaster.no_valid_host",
        "loadmaster.concurrent_update",
    }
    assert len(placed) == HOSTS * SLOTS_PER_HOST  # every slot taken, none twice
    assert audit(lm.store) == []
    for usage in lm.allocations.usages().values():
        assert all(u.active + u.pending <= u.capacity for u in usage.values())
    members = Counter(vm.host for vm in lm.groups.members("apart") if vm.host)
    assert members and max(members.values()) == 1
    lm.close()


GROUPS = 20


def _first_members(
    url: str, vms: list[str], host: str, in_step: mp.synchronize.Barrier, out: mp.Queue
) -> None:
    lm = loadmaster.open(url, migrate=False)
    lm.scheduler.refresh()
    outcomes = []
    for vm in vms:
        in_step.wait()
        placement = lm.scheduler.schedule([RequestSpec(vms=[vm], include_hosts=[host])])
        p = placement.placements[0]
        outcomes.append((p.vm, p.host, None if p.error is None else p.error.code))
    out.put(outcomes)
    lm.close()


@pytest.mark.postgres
def test_affinity_holds_when_two_schedulers_place_first_members_at_once(pg_url: str) -> None:
    """Two schedulers each send one member of every affinity group to their own host, group
    after group, in step. Host generations cannot see this race (different hosts); the
    ledger's group lock does: no group ends split, the loser is told no host fits."""
    lm = loadmaster.open(pg_url)
    add_hosts(lm, 2, vcpu=256, memory=262144)
    small_flavor(lm)
    pairs = []
    for g in range(GROUPS):
        lm.groups.create(f"together-{g}", "affinity")
        pairs.append(add_vms(lm, 2, group=f"together-{g}", prefix=f"g{g}-"))
    ctx = mp.get_context("spawn")
    in_step, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(
            target=_first_members, args=(pg_url, [p[i] for p in pairs], f"h{i}", in_step, out)
        )
        for i in range(2)
    ]
    for p in procs:
        p.start()
    outcomes = [row for _ in procs for row in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert {error for _, _, error in outcomes} <= {None, "loadmaster.no_valid_host"}
    split = [
        g
        for g in range(GROUPS)
        if len({vm.host for vm in lm.groups.members(f"together-{g}") if vm.host}) > 1
    ]
    assert split == [], f"{len(split)} of {GROUPS} affinity groups split over two hosts"
    assert sum(host is not None for _, host, _ in outcomes) == GROUPS  # one member each
    assert audit(lm.store) == []
    lm.close()
