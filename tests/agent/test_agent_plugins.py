"""A third party adds a collector, a controller and a hypervisor driver through entry
points, without touching loadmaster: a fake installed distribution on sys.path is all it
takes (issue 14: the agent is open as the scheduler is)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from agent_helpers import FIXTURES
from scripted_hv import ScriptedHypervisor
from test_incomplete_samples import full

from loadmaster.agent import run_agent
from loadmaster.agent.manager.host_manager import ManagerConfig
from loadmaster.agent.sla import Agent
from loadmaster.agent.sla.collectors import collector_selection
from loadmaster.agent.sla.controllers import default_controllers
from loadmaster.errors import ValidationError

PLUGIN = '''
from loadmaster.agent.sla.controllers import Action, HypervisorController


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


OPENED = []


def scripted_driver(options):
    """A hypervisor driver: the URI names the guests it runs."""
    from scripted_hv import ScriptedHypervisor
    from test_incomplete_samples import full

    OPENED.append(options)
    return ScriptedHypervisor({name: full() for name in options.uri.split("//")[1].split(",")})
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
        "[loadmaster.controllers]\nfan = lm_fans:FanController.build\n\n"
        "[loadmaster.hypervisors]\nscripted = lm_fans:scripted_driver\n"
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


def test_a_third_party_hypervisor_driver_runs_the_agent(third_party: Path, tmp_path: Path) -> None:
    import lm_fans

    (third_party / "fan.policy").write_text(
        '(with Guests g (if (> g.gpu_temp 72) (g.Control "fan_speed" 100) 0))'
    )
    config = tmp_path / "host.toml"
    config.write_text('[host]\ndriver = "scripted"\n')
    reports = run_agent(
        "scripted://a,bcd,efgh",
        third_party,
        0.0,
        None,
        None,
        "h1",
        cycles=1,
        config_file=config,
        collectors="HostMemory,GuestMemory,gpu-temp",
    )
    assert [r.guests for r in reports] == [3]
    assert lm_fans.OPENED[-1].uri == "scripted://a,bcd,efgh"
    assert sorted(guest for guest, _ in lm_fans.FanController.applied_speeds[-2:]) == [
        "bcd",
        "efgh",
    ]


def test_an_unknown_driver_is_refused_naming_the_known_ones(third_party: Path) -> None:
    with pytest.raises(ValidationError, match=r"driver 'nonesuch'.*known: libvirt, scripted"):
        run_agent("x://", third_party, 0.0, None, None, "h1", cycles=1, driver="nonesuch")
    assert ManagerConfig.from_dict({"host": {"driver": "scripted"}}).driver == "scripted"
