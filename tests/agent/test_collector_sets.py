"""Collectors chosen by MOM's names declare MOM's mandatory and optional fields; the
readable fields and the readiness of every sample follow from them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from agent_helpers import FIXTURES
from scripted_hv import ScriptedHypervisor
from test_incomplete_samples import full, without
from typer.testing import CliRunner

from loadmaster.agent.sla import Agent
from loadmaster.agent.sla.collectors import (
    CollectorSet,
    CollectorSources,
    Declaration,
    named_collectors,
)
from loadmaster.cli import app

# MOM 0.6.5's getFields / getOptionalFields, written out.
MOM_HOST_MANDATORY = {
    "mem_available", "mem_unused", "mem_free", "anon_pages", "swap_total", "swap_usage",
    "swap_in", "swap_out",  # HostMemory
    "ksm_run", "ksm_sleep_millisecs", "ksm_pages_shared", "ksm_pages_sharing",
    "ksm_pages_unshared", "ksm_pages_to_scan", "ksm_pages_volatile", "ksm_full_scans",
    "ksm_merge_across_nodes", "ksm_shareable",  # HostKSM (ksmd_cpu_usage: see below)
    "cpu_count",  # HostCpu
}  # fmt: skip
VDSM_GUEST_FIELDS = {
    "mem_available", "mem_unused", "major_fault", "minor_fault", "swap_in", "swap_out",
    "swap_total", "swap_usage", "balloon_cur", "balloon_max", "balloon_min",
    "vcpu_quota", "vcpu_period", "vcpu_user_limit", "vcpu_count", "io_tune",
}  # fmt: skip


def declarations(name: str | CollectorSet) -> tuple[Declaration, Declaration]:
    hosts, guests = named_collectors(name, CollectorSources(ScriptedHypervisor()))
    return Declaration.of(hosts), Declaration.of(guests)


def test_vdsm_set_declares_moms_fields() -> None:
    host, guest = declarations("vdsm")
    assert host.mandatory == MOM_HOST_MANDATORY
    # Declared by MOM's HostKSM; not measured here, so it reads nil (docs/mom-differences.md).
    assert host.fields == MOM_HOST_MANDATORY | {"ksmd_cpu_usage"}
    assert guest.mandatory == {"vcpu_quota", "vcpu_period", "vcpu_user_limit", "vcpu_count"}
    assert guest.fields == VDSM_GUEST_FIELDS


def test_mom_libvirt_set_needs_the_guest_memory_statistics(tmp_path: Path) -> None:
    _, guest = declarations("mom-libvirt")
    assert guest.mandatory == {
        "mem_available", "mem_unused", "major_fault", "minor_fault", "swap_in", "swap_out"
    }  # fmt: skip
    assert guest.fields == guest.mandatory | {"swap_total", "swap_usage"}
    (tmp_path / "p.policy").write_text('(with Guests g (g.Control "balloon_target" g.mem_unused))')
    hv = ScriptedHypervisor({"up": full(), "agentless": without(full(), "mem_unused")})
    report = Agent(hv, tmp_path, collectors="mom-libvirt", proc_root=FIXTURES / "proc").run_cycle()
    assert report.left_out == {"agentless": "not ready: mandatory mem_unused missing"}
    assert report.guest_controls == {"up": {"balloon_target": 1_048_576}}


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ("ovirt", "unknown collector set or collector 'ovirt'"),
        ("HostMemory,GuestSwap", "unknown collector set or collector 'GuestSwap'"),
        (CollectorSet(("HostMemory", "HostSwap"), ()), "unknown host collector 'HostSwap'"),
        (CollectorSet((), ("GuestQemuProc",)), "unknown guest collector 'GuestQemuProc'"),
    ],
)
def test_unknown_names_are_refused_by_name(selection: str | CollectorSet, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        declarations(selection)


def test_collectors_by_name_and_as_objects_do_not_mix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        Agent(ScriptedHypervisor(), tmp_path, collectors="vdsm", guest_collectors=[])


def test_default_set_keeps_its_fields_and_leaves_no_guest_out(tmp_path: Path) -> None:
    # Under vdsm's set guest.mem_free is an undefined symbol (case 6); the default set
    # declares it, and declares nothing mandatory, as before.
    (tmp_path / "p.policy").write_text('(with Guests g (g.Control "balloon_target" g.mem_free))')
    hv = ScriptedHypervisor({"a": full(), "b": without(full(), "vcpu_count", "mem_free")})
    report = Agent(hv, tmp_path, proc_root=FIXTURES / "proc").run_cycle()
    assert report.left_out == {} and report.policy_error is None
    assert report.guest_controls == {
        "a": {"balloon_target": 1_572_864},
        "b": {"balloon_target": None},  # nil is recorded; the controller ignores it
    }


def test_an_incomplete_host_sample_is_not_kept_for_statavg(tmp_path: Path) -> None:
    proc = Path(shutil.copytree(FIXTURES / "proc", tmp_path / "proc"))
    meminfo = (proc / "meminfo").read_text()
    (proc / "meminfo").write_text(meminfo.replace("Cached:          2048000 kB\n", ""))
    (tmp_path / "p.policy").write_text('(Host.Control "ksm_run" (Host.StatAvg "mem_free"))')
    hv = ScriptedHypervisor({"a": full()})
    agent = Agent(hv, tmp_path, collectors="vdsm", proc_root=proc)
    skipped = agent.run_cycle()
    assert skipped.host_not_ready == "host not ready: mandatory mem_free missing"
    assert skipped.host_controls == {} and skipped.actions == []
    (proc / "meminfo").write_text(meminfo.replace("MemFree:         4096000", "MemFree: 4000000"))
    ran = agent.run_cycle()
    assert ran.host_not_ready is None
    # Only the complete sample is averaged: 4,000,000 + 512,000 + 2,048,000.
    assert ran.host_controls == {"ksm_run": 6_560_000.0}


def test_cli_refuses_an_unknown_collector_set(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["agent", "--hypervisor", "test:///default", "--policy-dir", str(tmp_path),
         "--collectors", "ovirt", "--cycles", "1"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "unknown collector set or collector 'ovirt'" in result.output
