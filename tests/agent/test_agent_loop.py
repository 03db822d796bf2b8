"""The agent loop: all-or-nothing cycles, isolated failures, policy hot reload, reports,
and the simulator it is demonstrated and benchmarked on."""

from __future__ import annotations

import os
import shutil
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import FakePolicy

from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.sla.controllers import ControlContext, Controller, Outcome
from loadmaster.agent.sla.controllers.balloon import BalloonController
from loadmaster.agent.sla.simulated import simulated_agent
from loadmaster.demo.simulation import simulate_host
from loadmaster.policy import PolicyError, shipped_policy_dir


class Exploding(Controller):
    name = "exploding"

    def apply(self, ctx: ControlContext) -> Outcome:
        raise RuntimeError("boom")


def test_policy_error_means_no_controller_runs(tmp_path: Path) -> None:
    sim = SimulatedHypervisor.mixed(4, seed=3)
    policy = FakePolicy(
        guest_controls={"vm-0000": {"balloon_target": GIB}},
        error=PolicyError("02-balloon.policy", 7, 3, "undefined symbol foo"),
    )
    agent = simulated_agent(sim, tmp_path, policy_loader=policy.loader)
    report = agent.run_cycle()
    assert report.policy_error == "02-balloon.policy:7:3: undefined symbol foo"
    assert report.actions == [] and report.guest_controls == {}
    assert sim.balloon_info(sim.list_guests()[0].uuid).current > GIB


def test_a_failing_controller_does_not_stop_the_others(tmp_path: Path) -> None:
    sim = SimulatedHypervisor.mixed(2, seed=3)
    policy = FakePolicy(guest_controls={"vm-0001": {"balloon_target": GIB}})
    agent = simulated_agent(
        sim,
        tmp_path,
        policy_loader=policy.loader,
        controllers=[Exploding(), BalloonController(sim)],
    )
    report = agent.run_cycle()
    assert [(f.controller, f.error) for f in report.failures] == [
        ("exploding", "RuntimeError: boom")
    ]
    assert [(a.target, a.value) for a in report.actions] == [("vm-0001", GIB)]


def test_hypervisor_down_is_a_reported_cycle_not_a_crash(tmp_path: Path) -> None:
    sim = SimulatedHypervisor.mixed(2, seed=3)
    sim.broken.add("list_guests")
    agent = simulated_agent(sim, tmp_path, policy_loader=FakePolicy().loader)
    report = agent.run_cycle()
    assert report.failures[0].error.startswith("list guests")


def test_hot_reload_keeps_the_old_policy_when_the_new_one_is_broken(tmp_path: Path) -> None:
    policies = Path(shutil.copytree(shipped_policy_dir(), tmp_path / "policies"))
    sim = SimulatedHypervisor.mixed(6, seed=5)
    agent = simulated_agent(sim, policies)
    first = agent.run_cycle()
    assert first.policy_error is None and first.rejected_policy is None
    old_policy = agent.watcher.policy

    (policies / "20-site.policy").write_text("(defvar a 1)\n(+ a\n   (oops 2)))\n")
    broken = agent.run_cycle()
    assert broken.rejected_policy is not None
    assert broken.rejected_policy.startswith("20-site.policy:3:")
    assert agent.watcher.policy is old_policy
    assert broken.policy_error is None and broken.guest_controls  # the old policy still runs
    assert agent.run_cycle().rejected_policy == broken.rejected_policy

    (policies / "20-site.policy").write_text("(set balloonEnabled False)\n")
    fixed = agent.run_cycle()
    assert fixed.policy_reloaded and fixed.rejected_policy is None
    assert agent.watcher.policy is not old_policy


def test_touching_files_without_changing_them_does_not_reload(tmp_path: Path) -> None:
    policies = Path(shutil.copytree(shipped_policy_dir(), tmp_path / "policies"))
    agent = simulated_agent(SimulatedHypervisor.mixed(1), policies)
    target = policies / "02-balloon.policy"
    os.utime(target, ns=(1, 1))
    assert not agent.run_cycle().policy_reloaded


def test_agent_refuses_to_start_with_a_broken_policy(tmp_path: Path) -> None:
    (tmp_path / "main.policy").write_text("(+ 1")
    with pytest.raises(PolicyError):
        simulated_agent(SimulatedHypervisor.mixed(1), tmp_path)


def test_reports_every_n_cycles_and_survives_a_failing_reporter(tmp_path: Path) -> None:
    sim = SimulatedHypervisor.mixed(3, seed=2)
    sent: list[dict[str, Any]] = []

    def reporter(host: str, payload: dict[str, Any]) -> None:
        if len(sent) == 1:
            sent.append({})
            raise OSError("connection refused")
        sent.append(payload)

    listings: list[datetime] = []
    list_guests = sim.list_guests

    def timed_list_guests() -> list[Any]:
        listings.append(datetime.now(UTC))
        return list_guests()

    sim.list_guests = timed_list_guests  # type: ignore[method-assign]
    agent = simulated_agent(
        sim, tmp_path, policy_loader=FakePolicy().loader, reporter=reporter, report_every=2
    )
    reports = [agent.run_cycle() for _ in range(4)]
    assert [r.reported for r in reports] == [True, False, False, False]
    assert reports[2].failures[0].controller == "reporter"
    payload = sent[0]
    assert sorted(payload["running_vms"]) == sorted(g.uuid for g in sim.list_guests())
    assert set(payload["usage"]) == {"MEMORY_MB", "VCPU"}
    assert set(payload["load"]) == {"cpu", "memory"}
    assert 0 <= payload["load"]["memory"] <= 1
    # Judged as of the listing, not the arrival: stamped before the guests were listed.
    listed_at = datetime.fromisoformat(payload["as_of"])
    assert listed_at.tzinfo is not None and listed_at <= listings[0]


def test_run_forever_stops_on_the_event(tmp_path: Path) -> None:
    sim = SimulatedHypervisor.mixed(1)
    agent = simulated_agent(sim, tmp_path, policy_loader=FakePolicy().loader)
    agent.interval = 0.01
    stop = threading.Event()
    thread = threading.Thread(target=agent.run_forever, args=(stop,))
    thread.start()
    while agent.cycles < 3:
        stop.wait(0.005)
    stop.set()
    thread.join(timeout=2)
    assert not thread.is_alive()


def trajectory(seed: int) -> list[tuple[int, int, int]]:
    sim = SimulatedHypervisor.mixed(8, seed=seed, ramp_steps=20)
    points = []
    for _ in range(25):
        sim.advance()
        points.append(
            (sim.host_used_kib, sim.guest_swap_kib(), sim.list_guests()[3].vcpu_user_limit)
        )
    return [(u, s, int(v)) for u, s, v in points]


def test_simulator_is_deterministic_for_a_seed() -> None:
    assert trajectory(11) == trajectory(11)
    assert trajectory(11) != trajectory(12)


def test_simulated_host_stays_out_of_swap_and_platinum_keeps_its_memory(tmp_path: Path) -> None:
    result = simulate_host(guests=20, steps=90, seed=4, out_dir=tmp_path / "out")
    assert result.max_swap_kib_without_policy > GIB
    assert result.max_swap_kib_with_policy == 0
    assert result.min_platinum_balloon_ratio == 1.0
    assert result.min_gold_balloon_ratio >= 0.75
    assert result.min_silver_balloon_ratio >= 0.5
    assert result.controller_failures == 0
    assert result.stopped_guests and result.migration_requests
    lines = result.csv_path.read_text().splitlines()
    assert len(lines) == 91 and lines[0].startswith("step,")
    assert result.png_path.read_bytes().startswith(b"\x89PNG")
    assert "simulation.png" in result.html_path.read_text()
    again = simulate_host(guests=20, steps=90, seed=4, out_dir=tmp_path / "again")
    assert again.csv_path.read_text() == result.csv_path.read_text()
