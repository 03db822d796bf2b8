"""Network bandwidth and NUMA placement: collectors, controllers (on change only, whole
directions, refusals), the simulator's libvirt-like checks, the libvirt test driver, and
the journal."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import FakePolicy, collected_context

from loadmaster.agent.hypervisor.base import (
    NET_LIMIT_MAX,
    HypervisorError,
    format_nodeset,
    parse_nodeset,
)
from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor
from loadmaster.agent.hypervisor.simulated import GIB, SimGuestSpec, SimulatedHypervisor
from loadmaster.agent.sla import read_journal
from loadmaster.agent.sla.collectors.net import GuestNetCollector
from loadmaster.agent.sla.collectors.numa import GuestNumaCollector
from loadmaster.agent.sla.controllers import ControlContext
from loadmaster.agent.sla.controllers.nettune import NetTuneController, net_limit
from loadmaster.agent.sla.controllers.numatune import NumaTuneController
from loadmaster.agent.sla.journal import AppliedJournal
from loadmaster.agent.sla.simulated import simulated_agent

Hv = SimulatedHypervisor | LibvirtHypervisor


def sim() -> SimulatedHypervisor:
    return SimulatedHypervisor(
        [
            SimGuestSpec("two-nics", 4 * GIB, GIB, interfaces=2),
            SimGuestSpec("no-nic", 4 * GIB, GIB, interfaces=0),
        ],
        host_memory_kib=16 * GIB,
        numa_nodes=2,
    )


def context(hv: Hv, guest_controls: Mapping[str, Mapping[str, Any]]) -> ControlContext:
    """A cycle's context whose snapshots come from the real collectors."""
    collectors = (GuestNetCollector(hv), GuestNumaCollector(hv))
    return collected_context(hv.list_guests(), collectors, guest_controls)


class Calls:
    """Counts the hypervisor calls a controller makes."""

    def __init__(self, hv: SimulatedHypervisor) -> None:
        self.hv = hv
        self.net: list[tuple[str, dict[str, int]]] = []
        self.numa: list[tuple[str | None, str | None]] = []

    def set_interface_bandwidth(self, uuid: str, interface: str, limits: Mapping[str, int]) -> None:
        self.hv.set_interface_bandwidth(uuid, interface, limits)
        self.net.append((interface, dict(limits)))

    def set_numa_tune(self, uuid: str, *, mode: str | None, nodeset: str | None) -> None:
        self.hv.set_numa_tune(uuid, mode=mode, nodeset=nodeset)
        self.numa.append((mode, nodeset))


def uuid_of(hv: Hv, name: str) -> str:
    return next(g.uuid for g in hv.list_guests() if g.name == name)


def test_the_collectors_read_every_interface_and_the_placement() -> None:
    hv = sim()
    ctx = context(hv, {})
    two, none = ctx.snapshots["two-nics"], ctx.snapshots["no-nic"]
    assert ctx.guests["two-nics"].interfaces == ("vnet0", "vnet1")
    assert two.stats["net_interfaces"] == 2 and two.stats["net_inbound_average"] == 0
    assert set(two.properties["net_bandwidth"]) == {"vnet0", "vnet1"}
    # No interface: no per-interface stats at all, rather than stats reported missing.
    assert none.stats == {"net_interfaces": 0}
    assert two.properties["numa_mode"] == "strict" and two.properties["numa_nodeset"] == ""


def test_net_limits_per_interface_on_change_only_and_whole_directions() -> None:
    hv = sim()
    calls = Calls(hv)
    ctl = NetTuneController(calls)  # type: ignore[arg-type]
    uuid = uuid_of(hv, "two-nics")
    controls = {
        "net_inbound_average": 1000,
        "net_inbound_peak": 2000,
        "net_outbound_average@vnet1": 500.7,  # one interface only
    }
    out = ctl.apply(context(hv, {"two-nics": controls, "no-nic": controls}))
    assert out.failures == []
    inbound = {"inbound.average": 1000, "inbound.peak": 2000, "inbound.burst": 0}
    outbound = {"outbound.average": 500, "outbound.peak": 0, "outbound.burst": 0}
    assert calls.net == [("vnet0", inbound), ("vnet1", {**inbound, **outbound})]
    assert hv.interface_bandwidth(uuid, "vnet1")["outbound.average"] == 500
    assert hv.interface_bandwidth(uuid, "vnet0")["outbound.average"] == 0
    # Journalled per interface, only what changed.
    assert sorted((a.control, a.value) for a in out.actions) == [
        ("net_inbound_average@vnet0", 1000),
        ("net_inbound_average@vnet1", 1000),
        ("net_inbound_peak@vnet0", 2000),
        ("net_inbound_peak@vnet1", 2000),
        ("net_outbound_average@vnet1", 500),
    ]
    # The same request again: nothing sent.
    calls.net.clear()
    assert ctl.apply(context(hv, {"two-nics": controls})).actions == []
    assert calls.net == []
    # Only the burst changes: the direction goes with its average, as libvirt wants it.
    out = ctl.apply(context(hv, {"two-nics": {**controls, "net_inbound_burst@vnet0": 64}}))
    assert calls.net == [("vnet0", {**inbound, "inbound.burst": 64})]
    assert [(a.control, a.value) for a in out.actions] == [("net_inbound_burst@vnet0", 64)]


def test_no_average_means_no_peak_and_a_bad_value_is_refused() -> None:
    hv = sim()
    calls = Calls(hv)
    ctl = NetTuneController(calls)  # type: ignore[arg-type]
    ctl.apply(context(hv, {"two-nics": {"net_outbound_average": 100, "net_outbound_peak": 200}}))
    calls.net.clear()
    out = ctl.apply(
        context(hv, {"two-nics": {"net_outbound_average": 0, "net_outbound_peak": 200}})
    )
    lifted = {"outbound.average": 0, "outbound.peak": 0, "outbound.burst": 0}
    assert calls.net == [("vnet0", lifted), ("vnet1", lifted)]
    assert {(a.control, a.value) for a in out.actions} == {
        ("net_outbound_average@vnet0", 0),
        ("net_outbound_peak@vnet0", 0),
        ("net_outbound_average@vnet1", 0),
        ("net_outbound_peak@vnet1", 0),
    }
    out = ctl.apply(context(hv, {"two-nics": {"net_inbound_average": "fast"}}))
    assert [f.error for f in out.failures] == [
        "refused: net_inbound_average='fast' is no number"
    ] * 2


def test_net_limit_is_what_libvirt_takes() -> None:
    assert net_limit(-5) == 0  # no limit
    assert net_limit(12.9) == 12
    assert net_limit(1e20) == NET_LIMIT_MAX


def test_a_refused_net_change_is_reported_and_retried() -> None:
    hv = sim()
    ctl = NetTuneController(hv)
    hv.broken.add("set_interface_bandwidth")
    out = ctl.apply(context(hv, {"two-nics": {"net_outbound_average": 100}}))
    assert [f.target for f in out.failures] == ["two-nics", "two-nics"]
    assert "vnet0" in out.failures[0].error and out.actions == []
    hv.broken.clear()
    out = ctl.apply(context(hv, {"two-nics": {"net_outbound_average": 100}}))
    assert out.failures == [] and len(out.actions) == 2


def test_simulator_checks_interface_parameters_like_libvirt() -> None:
    hv = sim()
    uuid = uuid_of(hv, "two-nics")
    with pytest.raises(HypervisorError, match="not a known interface"):
        hv.set_interface_bandwidth(uuid, "vnet9", {"inbound.average": 1})
    with pytest.raises(HypervisorError, match="out of range"):
        hv.set_interface_bandwidth(uuid, "vnet0", {"inbound.average": -1})
    with pytest.raises(HypervisorError, match="out of range"):
        hv.set_interface_bandwidth(uuid, "vnet0", {"inbound.peak": NET_LIMIT_MAX + 1})
    with pytest.raises(HypervisorError, match="unsupported"):
        hv.set_interface_bandwidth(uuid, "vnet0", {"inbound.floor": 1})
    # A direction without an average has no limit: its peak is dropped.
    hv.set_interface_bandwidth(uuid, "vnet0", {"outbound.peak": 300})
    assert hv.interface_bandwidth(uuid, "vnet0")["outbound.peak"] == 0


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("0", "0"), ("1,0", "0-1"), ("0-3,^2,5", "0-1,3,5"), ("3,1,2", "1-3"), ("0-0", "0")],
)
def test_node_sets_in_libvirt_syntax(text: str, canonical: str) -> None:
    assert format_nodeset(parse_nodeset(text)) == canonical


@pytest.mark.parametrize("text", ["", "a", "1-", "2-1", "^0", "0,,1", "-1", "٣"])
def test_bad_node_sets(text: str) -> None:
    with pytest.raises(ValueError):
        parse_nodeset(text)


def test_numa_on_change_only_with_canonical_node_sets() -> None:
    hv = sim()
    calls = Calls(hv)
    ctl = NumaTuneController(calls)  # type: ignore[arg-type]
    out = ctl.apply(context(hv, {"two-nics": {"numa_nodeset": "1,0", "numa_mode": "strict"}}))
    # The mode is already strict: only the node set is sent, in libvirt's form.
    assert calls.numa == [(None, "0-1")]
    assert [(a.control, a.value) for a in out.actions] == [("numa_nodeset", "0-1")]
    assert hv.numa_tune(uuid_of(hv, "two-nics")).nodeset == "0-1"
    for same in ("0-1", "0,1"):
        assert ctl.apply(context(hv, {"two-nics": {"numa_nodeset": same}})).actions == []
    # A number is one node (the policy language has no other way to write it).
    ctl.apply(context(hv, {"two-nics": {"numa_nodeset": 1.0}}))
    assert calls.numa[-1] == (None, "1")


def test_numa_refusals_are_reported_not_sent_or_not_remembered() -> None:
    hv = sim()
    calls = Calls(hv)
    ctl = NumaTuneController(calls)  # type: ignore[arg-type]
    out = ctl.apply(
        context(hv, {"two-nics": {"numa_mode": "spread"}, "no-nic": {"numa_nodeset": "x"}})
    )
    assert calls.numa == [] and out.actions == []
    assert sorted(f.target for f in out.failures) == ["no-nic", "two-nics"]
    # Refused by the (simulated) hypervisor, as QEMU does: no mode change while running,
    # no node the host lacks.
    out = ctl.apply(
        context(hv, {"two-nics": {"numa_mode": "interleave"}, "no-nic": {"numa_nodeset": 7}})
    )
    assert [f.error for f in out.failures] == [
        "can't change numatune mode for running domain",
        "NUMA node 7 is unavailable",
    ]
    assert out.actions == []


def test_net_and_numa_journalled_by_the_agent(tmp_path: Path) -> None:
    hv = sim()
    policy = FakePolicy(
        guest_controls={"two-nics": {"net_outbound_average": 256, "numa_nodeset": "0"}}
    )
    journal = AppliedJournal(tmp_path / "state")
    agent = simulated_agent(hv, tmp_path, policy_loader=policy.loader, journal=journal)
    first = agent.run_cycle()
    assert first.failures == []
    second = agent.run_cycle()
    assert [a for a in second.actions if a.controller in ("nettune", "numatune")] == []
    journal.close()
    state = read_journal(tmp_path / "state")
    uuid = uuid_of(hv, "two-nics")
    assert state.last[(uuid, "net_outbound_average@vnet0")].value == 256
    assert state.last[(uuid, "net_outbound_average@vnet1")].value == 256
    assert state.last[(uuid, "numa_nodeset")].value == "0"


def test_on_the_libvirt_test_driver(node_hv: LibvirtHypervisor) -> None:
    guests = {g.name: g for g in node_hv.list_guests()}
    assert guests["db-gold"].interfaces == ("testnet0", "testnet1")
    assert guests["batch-silver"].interfaces == ()
    controls = {"db-gold": {"net_inbound_average@testnet1": 800, "numa_nodeset": "0"}}
    ctx = context(node_hv, controls)
    net = NetTuneController(node_hv).apply(ctx)
    numa = NumaTuneController(node_hv).apply(ctx)
    assert net.failures == [] and numa.failures == []
    uuid = guests["db-gold"].uuid
    assert node_hv.interface_bandwidth(uuid, "testnet1")["inbound.average"] == 800
    assert node_hv.interface_bandwidth(uuid, "testnet0")["inbound.average"] == 0
    assert node_hv.numa_tune(uuid).nodeset == "0"
    # Read back by the collectors, so the next cycle sends nothing.
    fresh = NetTuneController(node_hv), NumaTuneController(node_hv)
    again = context(node_hv, controls)
    assert [c.apply(again).actions for c in fresh] == [[], []]
