"""Loadmaster's shipped policies: hand-checked cycles and the SLA tier guarantees as properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_helpers import guest, host

from loadmaster.policy import Policy, check_files, load_policy_dir, shipped_policy_dir
from loadmaster.policy.snapshot import EntitySnapshot

SHIPPED = load_policy_dir(shipped_policy_dir())
FULL = 4_000_000


def test_shipped_files() -> None:
    names = [f.name for f in SHIPPED.files]
    assert names == [
        "00-defines",
        "01-parameters",
        "02-balloon",
        "03-ksm",
        "04-cputune",
        "05-iotune",
        "10-sla-tiers",
    ]
    assert check_files(sorted(shipped_policy_dir().glob("*.policy"))) == []


def ksm_host(mem_free: float) -> EntitySnapshot:
    return host(
        mem_available=16_000_000,
        mem_free=mem_free,
        ksm_shareable=0,
        ksm_pages_shared=0,
        ksm_merge_across_nodes=1,
        ksm_pages_to_scan=100,
        cpu_count=4,
    )


def vm(name: str, *tags: str, **overrides: float | None) -> EntitySnapshot:
    stats: dict[str, float | None] = {
        "balloon_cur": FULL,
        "balloon_max": FULL,
        "balloon_min": 1_000_000,
        "mem_unused": 3_500_000,
        "vcpu_user_limit": 100,
        "vcpu_count": 2,
        "vcpu_quota": -1,
        "vcpu_period": 100_000,
    }
    stats.update(overrides)
    return guest(name, tags=tags, **stats)


RESET = {"vcpu_quota": -1, "vcpu_period": 100_000}


def test_critical_pressure_cycle() -> None:
    guests = [
        vm("plat", "platinum"),
        vm("gold", "gold"),
        vm("silver", "silver"),
        vm("be", "best-effort"),
        vm("comp", "compute"),
        vm("plat-comp", "platinum", "compute"),
        vm("plain"),
        vm("gold-low", "gold", balloon_cur=2_000_000, mem_unused=None),
    ]
    result = SHIPPED.evaluate(ksm_host(mem_free=500_000), guests)
    # Host: 500000 / 16e6 = 0.03125 free, critical. KSM: threshold 3.2e6, nothing shared,
    # free memory below threshold: run, sleep max(10, 10 * 16777216 / 16e6), scan 100 + 300.
    assert result.host_controls == {
        "ksm_merge_across_nodes": 1,
        "ksm_run": 1,
        "ksm_sleep_millisecs": pytest.approx(10.48576),
        "ksm_pages_to_scan": 400,
    }
    # 02-balloon for every full guest: guest_free = -0.05 + 0.03125 = -0.01875;
    # used = 4e6 - 3.5e6 = 5e5; ideal = max(1e6, 5e5 - 75000) = 1e6; the 5 % step
    # limits the move to 3.8e6.
    step = 3_800_000
    c = result.guest_controls
    assert c["plat"] == {"balloon_target": FULL, **RESET}  # floor = balloon_max
    assert c["gold"] == {"balloon_target": pytest.approx(step), **RESET}  # floor 3e6
    assert c["silver"] == {"balloon_target": pytest.approx(step), "migrate": 1, **RESET}
    assert c["be"] == {"balloon_target": pytest.approx(step), "migrate": 1, "stop": 1, **RESET}
    # compute: max(1e6, 5e5 + 0.05 * 4e6, 0.9 * 4e6) = 3.6e6, lower than 3.8e6.
    assert c["comp"] == {"balloon_target": pytest.approx(3_600_000), **RESET}
    assert c["plat-comp"] == {"balloon_target": FULL, **RESET}
    assert c["plain"] == {"balloon_target": pytest.approx(step), **RESET}
    # Skipped by ballooning (no mem_unused) but below the gold floor 0.75 * 4e6.
    assert c["gold-low"] == {"balloon_target": 3_000_000.0, **RESET}
    assert result.missing_guest_stats == {"gold-low": ("mem_unused",)}


def test_no_pressure_platinum_gets_its_allocation_back() -> None:
    guests = [
        vm("plat", "platinum", balloon_cur=3_000_000, mem_unused=1_000_000),
        vm("be", "best-effort", balloon_cur=3_000_000, mem_unused=1_000_000),
    ]
    result = SHIPPED.evaluate(ksm_host(mem_free=8_000_000), guests)
    # host_free 0.5 -> grow: guest_free 0.5, used 2e6, ideal 2e6 + 1.5e6 = 3.5e6 >
    # 1.05 * 3e6, capped at 4e6 -> 3.5e6; the platinum floor lifts it to 4e6.
    assert result.guest_controls["plat"]["balloon_target"] == FULL
    assert result.guest_controls["be"] == {"balloon_target": 3_500_000.0, **RESET}


def test_compute_keeps_full_cpu_even_with_a_user_limit() -> None:
    guests = [vm("comp", "compute", vcpu_user_limit=25), vm("plain", vcpu_user_limit=25)]
    result = SHIPPED.evaluate(ksm_host(mem_free=8_000_000), guests)
    assert result.guest_controls["comp"] == RESET
    # 25 % of 4 CPUs * 100000 / 2 vCPUs = 50000.
    assert result.guest_controls["plain"] == {"vcpu_quota": 50_000.0}


def test_missing_stats_skip_the_guest_and_are_reported() -> None:
    guests = [guest("bare", tags=["platinum"])]
    result = SHIPPED.evaluate(host(), guests)
    assert result.host_controls == {}
    assert result.guest_controls == {}
    assert result.missing_host_stats == (
        "cpu_count",
        "ksm_merge_across_nodes",
        "ksm_pages_shared",
        "ksm_pages_to_scan",
        "ksm_shareable",
        "mem_available",
        "mem_free",
    )
    assert set(result.missing_guest_stats["bare"]) >= {"balloon_cur", "balloon_max", "mem_unused"}


def test_parameters_switch_features_off() -> None:
    extra = Policy.from_text(
        "(set balloonEnabled False)(set slaTiersEnabled False)", "01-parameters.policy"
    )
    policy = Policy([*SHIPPED.files, *extra.files])
    result = policy.evaluate(ksm_host(mem_free=500_000), [vm("be", "best-effort")])
    assert result.guest_controls["be"] == RESET


# -- tier guarantees, whatever the stats ------------------------------------------------

stat = st.one_of(
    st.none(),
    st.integers(-(10**12), 10**12),
    st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False),
)
TIERS = ["platinum", "gold", "silver", "best-effort", "compute"]
GUEST_FIELDS = [
    "balloon_cur",
    "balloon_max",
    "balloon_min",
    "mem_unused",
    "vcpu_user_limit",
    "vcpu_count",
    "vcpu_quota",
    "vcpu_period",
]
HOST_FIELDS = [
    "mem_available",
    "mem_free",
    "ksm_shareable",
    "ksm_pages_shared",
    "ksm_merge_across_nodes",
    "ksm_pages_to_scan",
    "cpu_count",
]


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[EntitySnapshot, list[EntitySnapshot]]:
    host_stats = {f: draw(stat) for f in HOST_FIELDS}
    host_history = draw(st.lists(st.fixed_dictionaries({"mem_free": stat}), max_size=3))
    guests = []
    for i in range(draw(st.integers(1, 4))):
        stats = {f: draw(stat) for f in GUEST_FIELDS}
        if draw(st.booleans()):
            # Realistic shape: the allocation bounds the balloon.
            size = draw(st.integers(1, 10**9))
            stats.update(balloon_max=size, balloon_cur=draw(st.integers(0, size)))
        history = draw(
            st.lists(st.fixed_dictionaries({"balloon_cur": stat, "mem_unused": stat}), max_size=3)
        )
        tags = draw(st.sets(st.sampled_from(TIERS)))
        guests.append(guest(f"vm{i}", tags=sorted(tags), history=history, **stats))
    return host(history=host_history, **host_stats), guests


def _target(controls: dict[str, Any]) -> Any:
    return controls.get("balloon_target")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_tier_floors_hold_whatever_the_stats(
    snap: tuple[EntitySnapshot, list[EntitySnapshot]],
) -> None:
    h, guests = snap
    result = SHIPPED.evaluate(h, guests)  # the shipped policies never fail on numeric stats
    for g in guests:
        target = _target(dict(result.guest_controls.get(g.name, {})))
        if target is None:
            continue
        allocation = g.stats["balloon_max"]
        assert allocation is not None  # no rule sets a target without knowing the allocation
        if "platinum" in g.tags:
            assert target >= allocation
        elif "gold" in g.tags:
            assert target >= 0.75 * allocation
        elif "silver" in g.tags:
            assert target >= 0.5 * allocation


@settings(max_examples=100, deadline=None)
@given(snapshots())
def test_stop_only_for_best_effort_under_critical_pressure(
    snap: tuple[EntitySnapshot, list[EntitySnapshot]],
) -> None:
    h, guests = snap
    result = SHIPPED.evaluate(h, guests)
    available, free = h.stats["mem_available"], h.stats["mem_free"]
    for g in guests:
        controls = result.guest_controls.get(g.name, {})
        if "stop" in controls:
            assert g.tags & {"platinum", "gold", "silver"} == set()
            assert "best-effort" in g.tags
            assert available is not None and free is not None and available > 0
        if "migrate" in controls:
            assert g.tags & {"platinum", "gold"} == set()
