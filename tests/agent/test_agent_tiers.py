"""The SLA tiers end to end: the agent with the shipped policies on a simulated host
whose memory runs short, checked after every cycle."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadmaster.agent.hypervisor.simulated import GIB, SimGuestSpec, SimulatedHypervisor
from loadmaster.agent.sla.controllers import ControlContext
from loadmaster.agent.sla.controllers.stop import StopController
from loadmaster.agent.sla.simulated import simulated_agent
from loadmaster.demo.simulation import simulate_host
from loadmaster.policy import shipped_policy_dir
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot
from loadmaster.tiers import TIER_NAMES, priority_of, tier_of

# The design's guarantees, written out: the test checks the definition too.
GUARANTEE = {"platinum": 1.0, "gold": 0.75, "silver": 0.5}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    guests=st.integers(6, 24),
    seed=st.integers(0, 10_000),
    overcommit=st.floats(1.2, 2.2),
)
def test_tier_guarantees_and_orders_hold_every_cycle(
    guests: int, seed: int, overcommit: float
) -> None:
    sim = SimulatedHypervisor.mixed(guests, seed=seed, overcommit=overcommit, ramp_steps=15)
    agent = simulated_agent(sim, shipped_policy_dir())
    for _ in range(30):
        sim.advance()
        running = {g.name: g for g in sim.list_guests()}
        before = {g.uuid: sim.balloon_info(g.uuid).current for g in running.values()}
        report = agent.run_cycle()
        assert report.policy_error is None
        for g in running.values():
            if g.uuid not in {x.uuid for x in sim.list_guests()}:
                continue
            info = sim.balloon_info(g.uuid)
            guarantee = GUARANTEE.get(tier_of(g.tags).name, 0.0)
            assert info.current >= guarantee * info.maximum, (g.name, g.tags)
            if "platinum" in g.tags:
                assert info.current == info.maximum  # never ballooned at all
        vapor = [g for g in running.values() if tier_of(g.tags).name == "vapor"]
        stopped = [running[a.target] for a in report.actions if a.control == "stop"]
        for g in stopped:
            # Only vapor is stopped, and the lowest priority vapor first.
            assert tier_of(g.tags).name == "vapor"
            assert priority_of(g.tags) == min(priority_of(v.tags) for v in vapor)
        shrunk: dict[str, set[int]] = {}
        for a in report.actions:
            if a.control == "balloon_target" and a.value < before[a.uuid or ""]:
                g = running[a.target]
                shrunk.setdefault(tier_of(g.tags).name, set()).add(priority_of(g.tags))
        # Within a tier, one priority level gives memory at a time, the lowest first.
        for tier, levels in shrunk.items():
            assert len(levels) <= 1, (tier, levels)


def test_a_gold_vm_tagged_in_the_api_is_not_ballooned_below_75_percent() -> None:
    """The report in the issue: a gold VM ballooned to 41 % of its memory."""
    specs = [
        SimGuestSpec("gold", 8 * GIB, GIB, tags=frozenset({"gold"}), base=0.3, rise=0.6),
        *(
            SimGuestSpec(f"vapor-{i}", 8 * GIB, GIB, tags=frozenset({"vapor", f"priority:{i}"}))
            for i in range(3)
        ),
    ]
    sim = SimulatedHypervisor(specs, host_memory_kib=20 * GIB, ramp_steps=10)
    agent = simulated_agent(sim, shipped_policy_dir())
    gold = next(g.uuid for g in sim.list_guests() if g.name == "gold")
    lowest = 1.0
    for _ in range(40):
        sim.advance()
        agent.run_cycle()
        info = sim.balloon_info(gold)
        lowest = min(lowest, info.current / info.maximum)
    assert 0.75 <= lowest < 1.0  # ballooned, but never below its guarantee
    # Vapor was stopped, lowest priority first.
    assert sim.stopped[0] == "vapor-0"
    assert sim.stopped == sorted(sim.stopped)


def test_stop_controller_refuses_every_tier_but_vapor() -> None:
    specs = [
        SimGuestSpec(t, 2 * GIB, GIB, tags=frozenset({t})) for t in (*TIER_NAMES, "best-effort")
    ]
    sim = SimulatedHypervisor(specs, host_memory_kib=32 * GIB)
    guests = {g.name: g for g in sim.list_guests()}
    controls = {name: {"stop": 1} for name in guests}
    ctx = ControlContext(
        CycleResult({}, controls),
        EntitySnapshot("host", {}),
        guests,
        {n: EntitySnapshot(n, {}) for n in guests},
    )
    out = StopController(sim).apply(ctx)
    assert sorted(a.target for a in out.actions) == ["best-effort", "vapor"]
    assert sorted(f.target for f in out.failures) == ["compute", "gold", "platinum", "silver"]


def test_simulation_report_names_every_tier_against_its_guarantee(tmp_path: Path) -> None:
    result = simulate_host(guests=20, steps=60, seed=2, out_dir=tmp_path)
    assert set(result.min_balloon_ratio) == set(TIER_NAMES)
    assert result.min_balloon_ratio["platinum"] == 1.0
    assert result.min_balloon_ratio["gold"] >= 0.75
    page = result.html_path.read_text()
    for name in TIER_NAMES:
        assert f"smallest {name} balloon" in page
    assert "vapor VMs stopped" in page
    header = result.csv_path.read_text().splitlines()[0]
    assert "vapor_min_balloon" in header and "compute_min_balloon" in header
