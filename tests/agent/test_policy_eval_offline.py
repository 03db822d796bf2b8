"""``policy eval --collectors``: the agent's readiness model offline, so an operator
testing a policy gets the agent's answer; and ``stop`` against ``migrate`` decided as the
agent's controllers decide it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import FIXTURES
from scripted_hv import ScriptedHypervisor
from test_incomplete_samples import full, without
from typer.testing import CliRunner

from loadmaster.agent.sla import Agent
from loadmaster.agent.sla.collectors import (
    DEFAULT_HISTORY,
    CollectorSources,
    Declaration,
    named_collectors,
)
from loadmaster.cli import app
from loadmaster.policy import shipped_policy_dir
from loadmaster.policy.entities import HOST_MEMORY_STATS

HOST = dict.fromkeys(HOST_MEMORY_STATS, 1_000)


def policy_eval(tmp_path: Path, policy: str | Path, snapshot: Any, *options: str) -> Any:
    if isinstance(policy, str):
        (tmp_path / "p.policy").write_text(policy)
        policy = tmp_path / "p.policy"
    (tmp_path / "snapshot.json").write_text(json.dumps(snapshot))
    result = CliRunner().invoke(
        app,
        ["policy", "eval", str(policy), "--snapshot", str(tmp_path / "snapshot.json"), *options],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_not_ready_guests_are_left_out_as_the_agent_leaves_them(tmp_path: Path) -> None:
    policy = '(with Guests g (g.Control "balloon_target" g.mem_unused))'
    samples = {"up": full(), "agentless": without(full(), "mem_unused")}
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "p.policy").write_text(policy)
    agent = Agent(
        ScriptedHypervisor(samples),
        tmp_path / "agent",
        collectors="mom-libvirt",
        proc_root=FIXTURES / "proc",
    ).run_cycle()
    snapshot = {
        "host": {"stats": HOST},
        "guests": [{"name": n, "stats": s} for n, s in samples.items()],
    }
    offline = policy_eval(tmp_path, policy, snapshot, "--collectors", "mom-libvirt")
    assert offline["guests"] == agent.guest_controls == {"up": {"balloon_target": 1_048_576}}
    assert offline["left_out"] == agent.left_out
    assert offline["left_out"] == {"agentless": "not ready: mandatory mem_unused missing"}
    # Without a collector set, every field MOM knows is readable and nobody is left out
    # for readiness: the guest without mem_unused is given nil.
    plain = policy_eval(tmp_path, policy, snapshot)
    assert plain["guests"]["agentless"] == {"balloon_target": None}


def test_a_host_lacking_a_mandatory_field_skips_the_tick(tmp_path: Path) -> None:
    policy = '(Host.Control "ksm_run" 1)'
    snapshot = {"host": {"stats": {**HOST, "mem_free": None}}, "guests": []}
    out = policy_eval(tmp_path, policy, snapshot, "--collectors", "mom-libvirt")
    assert out["tick_skipped"] == "host not ready: mandatory mem_free missing"
    assert out["host"] == {} and out["guests"] == {}
    assert policy_eval(tmp_path, policy, snapshot)["host"] == {"ksm_run": 1}


def test_statavg_sees_only_the_samples_the_agent_accepted(tmp_path: Path) -> None:
    policy = '(with Guests g (g.Control "balloon_target" (g.StatAvg "mem_unused")))'
    history = [
        full(mem_unused=100),
        without(full(mem_unused=900), "vcpu_count"),
        full(mem_unused=300),
    ]
    vdsm_hosts = named_collectors("vdsm", CollectorSources(ScriptedHypervisor()))[0]
    vdsm_host = dict.fromkeys(Declaration.of(vdsm_hosts).mandatory, 1_000)
    snapshot = {
        "host": {"stats": vdsm_host},
        "guests": [{"name": "vm-1", "stats": history[-1], "history": history}],
    }
    # vdsm's GuestCpuTune makes vcpu_count mandatory: the middle sample was never kept.
    out = policy_eval(tmp_path, policy, snapshot, "--collectors", "vdsm")
    assert out["guests"] == {"vm-1": {"balloon_target": 200.0}}
    assert policy_eval(tmp_path, policy, snapshot)["guests"] == {
        "vm-1": {"balloon_target": 433.3333333333333}
    }


def test_statavg_sees_as_many_samples_as_an_agent_keeps(tmp_path: Path) -> None:
    policy = '(with Guests g (g.Control "balloon_target" (g.StatAvg "mem_unused")))'
    history = [full(mem_unused=1_000_000), *(full(mem_unused=100) for _ in range(DEFAULT_HISTORY))]
    snapshot = {
        "host": {"stats": HOST},
        "guests": [{"name": "vm-1", "stats": history[-1], "history": history}],
    }
    out = policy_eval(tmp_path, policy, snapshot, "--collectors", "mom-libvirt")
    assert out["guests"] == {"vm-1": {"balloon_target": 100.0}}


def test_only_the_collectors_fields_are_readable(tmp_path: Path) -> None:
    (tmp_path / "p.policy").write_text('(with Guests g (g.Control "x" g.balloon_cur))')
    (tmp_path / "snapshot.json").write_text(
        json.dumps({"host": {"stats": HOST}, "guests": [{"name": "vm-1", "stats": full()}]})
    )
    result = CliRunner().invoke(
        app,
        ["policy", "eval", str(tmp_path / "p.policy"), "--snapshot",
         str(tmp_path / "snapshot.json"), "--collectors", "mom-libvirt"],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "undefined symbol g.balloon_cur" in result.output


def test_an_unknown_collector_set_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "p.policy").write_text("(defvar a 1)")
    (tmp_path / "snapshot.json").write_text("{}")
    result = CliRunner().invoke(
        app,
        ["policy", "eval", str(tmp_path / "p.policy"), "--snapshot",
         str(tmp_path / "snapshot.json"), "--collectors", "ovirt"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--collectors: unknown collector set or collector 'ovirt'" in result.output


@pytest.mark.parametrize(
    ("tags", "wins"),
    [
        (["vapor"], "stop: a vapor VM is powered off"),
        (["gold"], "migrate: a gold VM is never stopped"),
    ],
)
def test_stop_or_migrate_says_which_the_agent_carries_out(
    tmp_path: Path, tags: list[str], wins: str
) -> None:
    policy = '(with Guests g { (g.Control "migrate" 1) (g.Control "stop" 1) })'
    snapshot = {"guests": [{"name": "vm-1", "stats": {}, "tags": tags}]}
    out = policy_eval(tmp_path, policy, snapshot)
    assert out["guests"] == {"vm-1": {"migrate": 1, "stop": 1}}
    assert out["stop_or_migrate"]["vm-1"].startswith(wins)


def test_the_shipped_policy_under_critical_pressure_says_stop_wins(tmp_path: Path) -> None:
    guest = {
        "name": "cheap",
        "stats": {"balloon_cur": 2_000_000, "balloon_max": 2_000_000, "balloon_min": 500_000,
                  "mem_unused": 1_000_000},
        "tags": ["vapor"],
    }  # fmt: skip
    snapshot = {
        "host": {"stats": {"mem_available": 8_000_000, "mem_free": 100_000}},
        "guests": [guest],
    }
    out = policy_eval(tmp_path, shipped_policy_dir(), snapshot)
    assert out["guests"]["cheap"]["stop"] == 1 and out["guests"]["cheap"]["migrate"] == 1
    assert out["stop_or_migrate"] == {"cheap": out["stop_or_migrate"]["cheap"]}
    assert out["stop_or_migrate"]["cheap"].startswith("stop: ")
