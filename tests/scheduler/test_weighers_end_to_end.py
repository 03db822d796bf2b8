"""Every shipped weigher end to end, through the policy that uses it, plus the raw scores.
The table-driven tests of each weigher, on synthetic snapshots with no database, are in
``test_core.py``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster.scheduler import POLICIES, Policy, RequestSpec, Scheduler, WeigherSetting, source
from loadmaster.scheduler.core.request import VmRequest
from loadmaster.scheduler.core.snapshot import Snapshot, SyntheticHost
from loadmaster.scheduler.core.weighers.balance import BalanceWeigher
from loadmaster.scheduler.core.weighers.pack import PackWeigher
from loadmaster.scheduler.core.weighers.spread import SpreadWeigher
from loadmaster.scheduler.reports import record_report
from loadmaster.service import Loadmaster


def _place(
    lm: Loadmaster, count: int, policy: str, *, group: str | None = None, prefix: str = "vm"
) -> Counter[str]:
    vms = add_vms(lm, count, group=group, prefix=prefix)
    result = lm.scheduler.schedule([RequestSpec(vms=vms)], policy=policy)
    assert result.ok
    return Counter(p.host for p in result.placements if p.host)


def test_spread_evens_out_and_pack_fills(slm: Loadmaster) -> None:
    add_hosts(slm, 4, vcpu=8)
    small_flavor(slm)
    assert _place(slm, 4, "spread") == dict.fromkeys(["h0", "h1", "h2", "h3"], 1)
    # Each host holds 4 and has 1: pack fills one host up before it touches another.
    assert sorted(_place(slm, 4, "pack").values()) == [1, 3]


def test_pack_prefers_the_fullest_per_class_normalised(slm: Loadmaster) -> None:
    add_hosts(slm, 1, prefix="big", vcpu=64, memory=65536)
    add_hosts(slm, 1, prefix="small", vcpu=8, memory=8192)
    small_flavor(slm)
    assert _place(slm, 1, "pack") == {"small0": 1}
    assert _place(slm, 1, "spread") == {"big0": 1}


def test_vm_count_policy_evens_the_number_of_vms(slm: Loadmaster) -> None:
    add_hosts(slm, 1, prefix="big", vcpu=64, memory=65536)
    add_hosts(slm, 1, prefix="small", vcpu=8, memory=16384)
    small_flavor(slm, vcpu=1, memory=512)
    assert _place(slm, 8, "vm-count") == {"big0": 4, "small0": 4}


def test_balance_prefers_evenly_filled_classes() -> None:
    hosts = Snapshot.of(
        [
            SyntheticHost("cpu0", {"VCPU": 8, "MEMORY_MB": 65536}),  # memory to spare
            SyntheticHost("even0", {"VCPU": 8, "MEMORY_MB": 16384}),
        ]
    )
    request = VmRequest("x", "x", "small", {"VCPU": 2, "MEMORY_MB": 4096})
    scores = BalanceWeigher().weigh(hosts, request, np.arange(2))
    assert scores is not None and scores[hosts.index["even0"]] > scores[hosts.index["cpu0"]]
    pack = PackWeigher(classes={"MEMORY_MB": 1.0}).weigh(hosts, request, np.arange(2))
    spread = SpreadWeigher(classes=["MEMORY_MB"]).weigh(hosts, request, np.arange(2))
    assert pack is not None and spread is not None
    assert pack.tolist() == pytest.approx([4096 / 65536, 4096 / 16384])
    assert spread.tolist() == pytest.approx([1 - 4096 / 65536, 1 - 4096 / 16384])


def test_soft_affinity_and_soft_anti_affinity(slm: Loadmaster) -> None:
    add_hosts(slm, 4, vcpu=16, memory=65536)
    small_flavor(slm, vcpu=1, memory=512)
    slm.groups.create("together", "soft-affinity")
    slm.groups.create("apart", "soft-anti-affinity")
    assert len(_place(slm, 6, "spread", group="together", prefix="t")) == 1
    assert sorted(_place(slm, 8, "pack", group="apart", prefix="a").values()) == [2, 2, 2, 2]


def test_measured_load_steers_spread(slm: Loadmaster) -> None:
    add_hosts(slm, 3, vcpu=16, memory=65536)
    small_flavor(slm, vcpu=1, memory=512)
    slm.scheduler.record_report("h0", {"VCPU": 12.0}, {"cpu": 0.9}, [])
    slm.scheduler.record_report("h1", {"VCPU": 1.0}, {"cpu": 0.1, "io": 0.05}, [])
    assert _place(slm, 1, "spread") == {"h1": 1}


def test_policy_is_chosen_per_request_and_by_configuration(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_hosts(slm, 2, vcpu=8)
    small_flavor(slm)
    assert set(POLICIES) == {"spread", "pack", "vm-count"}
    monkeypatch.setenv("LOADMASTER_SCHEDULER_POLICY", "pack")
    scheduler = Loadmaster(slm.store).scheduler
    assert scheduler.default_policy == "pack"
    result = scheduler.schedule([RequestSpec(vms=add_vms(slm, 3))])
    assert result.policy == "pack" and len({p.host for p in result.placements}) == 1
    custom = Policy(
        "memory-first",
        "pack memory only",
        (WeigherSetting("pack", 1.0, {"classes": ["MEMORY_MB"]}),),
    )
    assert (
        Scheduler(slm.store, policies={"memory-first": custom})
        .schedule([RequestSpec(flavor="small")], dry_run=True, policy="memory-first")
        .ok
    )


def test_reports_recorded_elsewhere_are_read_once_a_second_own_ones_at_once(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's reports (an API worker's, under the scheduling process) reach the
    load weigher at the first refresh a second after the last read of them; those
    recorded through this scheduler at its next refresh."""
    add_hosts(slm, 3, vcpu=16, memory=65536)
    small_flavor(slm, vcpu=1, memory=512)
    # Measured load alone decides: the VMs placed meanwhile weigh nothing.
    slm.scheduler.use_policies(
        {"by-load": Policy("by-load", "least loaded", (WeigherSetting("load", 1.0),))}
    )

    def elsewhere(host: str, cpu: float) -> None:
        record_report(slm.store, host, {"VCPU": 1.0}, {"cpu": cpu}, [])

    monkeypatch.setattr(source, "_REPORTS_EVERY_S", 3600.0)
    elsewhere("h0", 0.95)
    elsewhere("h1", 0.95)
    elsewhere("h2", 0.0)
    assert _place(slm, 1, "by-load", prefix="a") == {"h2": 1}  # the first refresh reads all
    elsewhere("h2", 0.99)
    elsewhere("h1", 0.0)
    assert _place(slm, 1, "by-load", prefix="b") == {"h2": 1}  # within the second: not read
    slm.scheduler.record_report("h0", {"VCPU": 1.0}, {"cpu": 0.9}, [])
    assert _place(slm, 1, "by-load", prefix="c") == {"h1": 1}  # its own: read, with the rest
    elsewhere("h1", 0.99)
    elsewhere("h0", 0.0)
    assert _place(slm, 1, "by-load", prefix="d") == {"h1": 1}
    monkeypatch.setattr(source, "_REPORTS_EVERY_S", 0.0)  # the second has passed
    assert _place(slm, 1, "by-load", prefix="e") == {"h0": 1}
