"""Issue #13, defect 1, in the agent: a policy file that would hang or blow up a cycle is
rejected with its file:line:col and the previous version keeps running; a FIFO in the
policy directory is refused without blocking the agent's start or its reloads."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from pathlib import Path

from loadmaster.agent.hypervisor.simulated import SimulatedHypervisor
from loadmaster.agent.sla import Agent
from loadmaster.agent.sla.simulated import simulated_agent
from loadmaster.policy import shipped_policy_dir

RUNAWAY = '(defvar s (* "x" 100000))\n(with s a (with s b 0))\n'
SHARES = '(with Guests g (g.Control "vcpu_shares" 1024))\n'


def policies(tmp_path: Path) -> Path:
    return Path(shutil.copytree(shipped_policy_dir(), tmp_path / "policies"))


def shares(report: object) -> set[object]:
    controls = report.guest_controls  # type: ignore[attr-defined]
    return {c.get("vcpu_shares") for c in controls.values()}


def test_a_runaway_version_is_rejected_and_the_previous_one_keeps_running(
    tmp_path: Path,
) -> None:
    directory = policies(tmp_path)
    (directory / "20-site.policy").write_text(SHARES)
    agent = simulated_agent(SimulatedHypervisor.mixed(4, seed=3), directory)
    assert shares(agent.run_cycle()) == {1024}

    (directory / "20-site.policy").write_text(RUNAWAY)
    report = agent.run_cycle()
    assert report.policy_error is None
    assert report.rejected_policy is not None
    assert report.rejected_policy.startswith("20-site.policy:2:")
    assert "exceeded" in report.rejected_policy
    assert shares(report) == {1024}  # the previous 20-site.policy ran this very cycle
    assert report.actions or report.guest_controls

    again = agent.run_cycle()
    assert again.rejected_policy == report.rejected_policy and shares(again) == {1024}
    # Not evaluated again while the file is unchanged: the cycle is quick.
    assert again.duration_s < report.duration_s


def test_an_agent_restarted_on_a_runaway_file_runs_the_others(tmp_path: Path) -> None:
    directory = policies(tmp_path)
    (directory / "20-site.policy").write_text(RUNAWAY)
    agent = simulated_agent(SimulatedHypervisor.mixed(4, seed=3), directory)
    report = agent.run_cycle()
    assert report.policy_error is None
    assert report.rejected_policy is not None and "20-site.policy:2:" in report.rejected_policy
    assert report.guest_controls  # the shipped policies ran
    assert "20-site.policy" not in agent.watcher.files.running  # type: ignore[union-attr]


def test_a_fifo_in_the_policy_directory_blocks_neither_start_nor_reload(tmp_path: Path) -> None:
    directory = policies(tmp_path)
    fifo = directory / "x.policy"
    os.mkfifo(fifo)
    made: list[Agent] = []
    try:
        thread = threading.Thread(
            target=lambda: made.append(
                simulated_agent(SimulatedHypervisor.mixed(2, seed=1), directory)
            ),
            daemon=True,
        )
        thread.start()
        thread.join(10)
        assert made, "the agent blocked on the FIFO at start"
        agent = made[0]
        report = agent.run_cycle()
        assert report.policy_file_errors == ["x.policy: not a regular file; refused"]
        assert report.policy_error is None and report.guest_controls

        # A FIFO that appears later is refused the same way at reload.
        os.mkfifo(directory / "y.policy")
        cycles: list[object] = []
        thread = threading.Thread(target=lambda: cycles.append(agent.run_cycle()), daemon=True)
        thread.start()
        thread.join(10)
        assert cycles, "the agent blocked on the FIFO at reload"
        assert cycles[0].policy_file_errors == [  # type: ignore[attr-defined]
            "x.policy: not a regular file; refused",
            "y.policy: not a regular file; refused",
        ]
    finally:
        for name in ("x.policy", "y.policy"):
            with contextlib.suppress(OSError):
                os.close(os.open(directory / name, os.O_WRONLY | os.O_NONBLOCK))
