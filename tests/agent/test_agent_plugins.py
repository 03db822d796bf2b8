"""A third party adds a collector and a controller through entry points, without touching
loadmaster: a fake installed distribution on sys.path is all it takes (issue 14: the agent
is open as the scheduler is)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from agent_helpers import FIXTURES
from scripted_hv import ScriptedHypervisor
from test_incomplete_samples import full

from loadmaster.agent import Agent
from loadmaster.agent.collectors import collector_selection
from loadmaster.agent.controllers import default_controllers

PLUGIN = '''
from loadmaster.agent.controllers import Action, HypervisorController


class GpuTemperature:
    """A guest collector that reads what the stock ones do not."""

    name = "gpu-temp"
    fields = ("gpu_temp",)

    def __init__(self, hypervisor):
        self.hypervisor = hypervisor

    def collect(self, guest):
        return {"gpu_temp": 70 + len(guest.name)}, {}


def gpu_temperature(sources):
    return GpuTemperature(sources.hypervisor)


class FanController(HypervisorController):
    """Applies the policy's ``fan_speed``; remembers it like the stock ones."""

    name = "fan"
    applied_speeds = []

    def apply(self, ctx):
        out = ctx.outcome()
        for guest, _snap, value in self._guest_controls(ctx, "fan_speed"):
            FanController.applied_speeds.append((guest.name, value))
            out.applied(Action(self.name, guest.name, "fan_speed", value, guest.uuid))
        return out
'''


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "lm_fans.py").write_text(textwrap.dedent(PLUGIN))
    dist = site / "lm_fans-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lm-fans\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[loadmaster.guest_collectors]\ngpu-temp = lm_fans:gpu_temperature\n\n"
        "[loadmaster.controllers]\nfan = lm_fans:FanController.build\n"
    )
    monkeypatch.syspath_prepend(str(site))
    policies = tmp_path / "policies"
    policies.mkdir()
    return policies


def test_third_party_collector_and_controller_run_in_the_agent(third_party: Path) -> None:
    import lm_fans  # type: ignore[import-not-found]

    (third_party / "fan.policy").write_text(
        '(with Guests g (if (> g.gpu_temp 72) (g.Control "fan_speed" 100) 0))'
    )
    hv = ScriptedHypervisor({"a": full(), "bcd": full()})
    agent = Agent(
        hv, third_party, collectors="HostMemory,GuestMemory,gpu-temp", proc_root=FIXTURES / "proc"
    )
    report = agent.run_cycle()
    assert report.policy_error is None
    assert lm_fans.FanController.applied_speeds == [("bcd", 100)]  # 70 + 3 > 72; 70 + 1 is not
    assert "fan" in [c.name for c in agent.controllers]


def test_controllers_run_in_order_with_stop_and_migrate_last(third_party: Path) -> None:
    names = [c.name for c in default_controllers(ScriptedHypervisor(), lambda uuid, why: None)]
    assert "fan" in names
    assert names[-2:] == ["stop", "migrate"]
    assert "migrate" not in [c.name for c in default_controllers(ScriptedHypervisor())]


def test_a_selection_puts_each_collector_on_its_side(third_party: Path) -> None:
    chosen = collector_selection("HostMemory, gpu-temp,GuestBalloon")
    assert chosen.host == ("HostMemory",)
    assert chosen.guest == ("gpu-temp", "GuestBalloon")
