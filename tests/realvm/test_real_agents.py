"""The whole loop on real QEMU guests: the loadmaster API served in-process over SQLite,
and one host manager per private libvirtd (hosts ``real-a`` and ``real-b``), each over
HTTP with a token bound to its host, registering the inventory it discovers from libvirt.
What ``test_real_guests.py`` checks on the hypervisor interface alone is checked here as
the agents carry it out from the ledger: a launch from a pending claim, API tags in the
domain metadata, the SLA policy's balloon and CPU tune on a VM launched that way, a live
migration and a failed one rolled back, a stop and a delete. And the SLA policy's own migration request, run through the
scheduler and the agents.

Two guests boot once for the module (at the same time, to save a boot) and the tests
then act on them in order; each test states what it needs of them, so each can also run
alone. Timings are printed (``pytest -s``) for docs/real-guests.md.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import libvirt
import pytest
from realvm_helpers import (
    BALLOON_S,
    MIB,
    STOP_S,
    Launched,
    PrivateLibvirtd,
    RealHosts,
    actual_balloon,
    booted,
    defined,
    fixture_sys,
    new_spec,
    pressured_proc,
    running,
    serial,
    settled,
    wait_for,
)
from typer.testing import CliRunner

import loadmaster
from loadmaster.agent.hypervisor.base import GuestSpec
from loadmaster.agent.hypervisor.libvirt import METADATA_NS, LibvirtHypervisor, parse_metadata
from loadmaster.agent.manager.host_manager import HostManager, ManagerConfig, StepReport
from loadmaster.agent.runner import ApiClient
from loadmaster.agent.sla.loop import Agent
from loadmaster.api import AuthConfig, create_app
from loadmaster.api.server import ThreadedServer, serve_in_thread
from loadmaster.cli import app
from loadmaster.demo.cloud import ADMIN_TOKEN, agent_token
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.pending import audit
from loadmaster.policy import shipped_policy_dir
from loadmaster.service import Loadmaster

pytestmark = [pytest.mark.realvm, pytest.mark.xdist_group("realvm")]

GUEST_MIB = 128
FLAVOR = "rv128"
# What an agent is given to act on a change of the ledger: its long-poll returns at once,
# the rest is libvirt. Generous for 2 shared cores.
ACT_S = 30.0
# A policy written for this test, run after the shipped ones: guests tagged "capped" get
# half a CPU's time per period and half the default weight.
CAPPED_POLICY = """
(with Guests guest
    (if (guest.HasTag "capped") {
        (guest.Control "vcpu_quota" 50000)
        (guest.Control "vcpu_period" 100000)
        (guest.Control "vcpu_shares" 512)
    } 0))
"""


class RecordingManager(HostManager):
    """Keeps what each pass did, so a test can tell which pass carried out a change."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[StepReport] = []

    def step(self, *, wait: float = 0.0) -> StepReport:
        report = super().step(wait=wait)
        self.steps.append(report)
        return report


@dataclass
class AgentHost:
    """One real host: its private libvirtd and its running host manager."""

    name: str
    daemon: PrivateLibvirtd
    hv: LibvirtHypervisor
    manager: RecordingManager
    client: ApiClient
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        # A 1 s long-poll, as the demo's agents: a change of the ledger still returns it at
        # once; the short wait only bounds how long a stop takes.
        self.thread = threading.Thread(
            target=self.manager.run_forever,
            args=(self.stop,),
            kwargs={"wait": 1.0},
            name=f"{self.name}-manager",
            daemon=True,
        )
        self.thread.start()

    def halt(self) -> None:
        """The manager stops talking to the API (its next long-poll is at most 1 s off)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=15)

    def close(self) -> None:
        self.halt()
        self.manager.close()
        self.client.close()
        self.hv.close()


@dataclass
class RealCloud:
    lm: Loadmaster
    server: ThreadedServer
    admin: httpx.Client
    real: RealHosts
    a: AgentHost
    b: AgentHost
    guests: Launched

    def create_vm(self, *tags: str, image: str | None = None) -> GuestSpec:
        """A VM created through the API (requested: nothing on any host yet)."""
        spec = new_spec(GUEST_MIB, *tags)
        body = {"name": spec.name, "uuid": spec.uuid, "flavor": FLAVOR, "tags": list(tags)}
        body |= {"image": image} if image else {}
        created = self.admin.post("/vms", json=body)
        assert created.status_code == 201, created.text
        self.guests.uuids.append(spec.uuid)
        return spec

    def vm(self, uuid: str) -> dict[str, Any]:
        answer = self.admin.get(f"/vms/{uuid}")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def records(self, uuid: str, host: AgentHost) -> list[str]:
        """The states of the VM's allocation records on ``host``."""
        return sorted({r.state for r in self.lm.allocations.allocations(vm=uuid, host=host.name)})

    def where_running(self, uuid: str) -> list[str]:
        return [h.name for h in (self.a, self.b) if uuid in running(h.hv)]

    def running_on(self, uuid: str, host: AgentHost) -> bool:
        vm = self.vm(uuid)
        return vm["state"] == "running" and vm["host"] == host.name and not vm["target_host"]

    def assert_clean(self) -> None:
        assert audit(self.lm.store) == []


@pytest.fixture(scope="module")
def cloud(real_hosts: RealHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCloud]:
    scratch = tmp_path_factory.mktemp("real-agents")
    lm = loadmaster.open(f"sqlite:///{scratch / 'loadmaster.db'}")
    names = {"real-a": real_hosts.a, "real-b": real_hosts.b}
    tokens = {ADMIN_TOKEN: "admin", **{agent_token(n): f"agent:{n}" for n in names}}
    server = serve_in_thread(create_app(lm, AuthConfig(tokens)))
    admin = httpx.Client(
        base_url=server.url,
        headers={**CLIENT_HEADERS, "Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=60,
    )
    flavor = {"name": FLAVOR, "resources": {"VCPU": 1, "MEMORY_MB": GUEST_MIB}}
    assert admin.post("/flavors", json=flavor).status_code == 201
    hosts: list[AgentHost] = []
    guests = Launched(real_hosts)
    try:
        for name, daemon in names.items():
            # KSM goes to a fixture /sys: a real driver would otherwise write the machine's.
            hv = real_hosts.hypervisor(daemon, sys_root=fixture_sys(scratch / f"{name}-sys"))
            client = ApiClient(server.url, agent_token(name), timeout=30.0)
            manager = RecordingManager(
                hv, client, ManagerConfig(), host_name=name, hypervisor_uri=daemon.uri
            )
            hosts.append(AgentHost(name, daemon, hv, manager, client))
            manager.register()
            hosts[-1].start()
        yield RealCloud(lm, server, admin, real_hosts, hosts[0], hosts[1], guests)
    finally:
        for host in hosts:
            host.stop.set()  # all at once: each may be in a long-poll
        for host in hosts:
            host.close()
        guests.clean()
        admin.close()
        server.stop()
        lm.close()


@pytest.fixture(scope="module")
def pair(cloud: RealCloud) -> tuple[GuestSpec, GuestSpec]:
    """Two VMs placed on real-a through the API, launched there by its manager from their
    pending claims; both boot at once."""
    first, second = cloud.create_vm("silver"), cloud.create_vm("platinum")
    started = time.monotonic()
    for spec in (first, second):
        claimed = cloud.admin.put(f"/vms/{spec.uuid}/allocations", json={"host": "real-a"})
        assert claimed.status_code == 200, claimed.text
        assert claimed.json()["state"] == "pending"
    for spec in (first, second):
        wait_for(
            f"{spec.name} running in the ledger",
            lambda s=spec: cloud.running_on(s.uuid, cloud.a),
            ACT_S,
        )
    up = time.monotonic() - started
    for spec in (first, second):
        booted(cloud.real, spec)
    print(
        f"claim to up (agent): {up:.1f} s; claim to lm-guest: up: "
        f"{time.monotonic() - started:.1f} s (two guests at once)"
    )
    return first, second


def test_registered_with_the_inventory_discovered_from_libvirt(cloud: RealCloud) -> None:
    for host in (cloud.a, cloud.b):
        info = host.hv.host_info()
        inventories = {n: inv.total for n, inv in cloud.lm.hosts.get(host.name).inventories.items()}
        assert inventories["VCPU"] == info.cpus
        # libvirt's node memory (from sysfs) moves a little on these machines.
        assert (
            abs(inventories["MEMORY_MB"] - info.memory_kib // 1024)
            <= 0.05 * inventories["MEMORY_MB"]
        )
        agent = cloud.admin.get(f"/hosts/{host.name}/agent").json()
        assert agent["status"] == "ok", agent


def test_launch_from_a_pending_claim(cloud: RealCloud, pair: tuple[GuestSpec, GuestSpec]) -> None:
    for spec in pair:
        guest = running(cloud.a.hv)[spec.uuid]
        assert guest.managed and guest.tags == spec.tags
        assert spec.uuid not in running(cloud.b.hv)
        assert cloud.records(spec.uuid, cloud.a) == ["active"]
        assert cloud.vm(spec.uuid)["fault"] is None
        # The flavor's memory, and a balloon driver that reports from inside the guest.
        assert cloud.a.hv.balloon_info(spec.uuid).maximum == GUEST_MIB * MIB
        wait_for(
            f"{spec.name} memory stats",
            lambda s=spec: "unused" in cloud.a.hv.memory_stats(s.uuid),
            BALLOON_S,
        )
        assert serial(cloud.real, spec).count("lm-guest: up") == 1
    cloud.assert_clean()


def test_api_tags_reach_the_domain_within_one_pass(
    cloud: RealCloud, pair: tuple[GuestSpec, GuestSpec]
) -> None:
    spec = pair[0]
    tags = {"silver", "priority:3"}
    started = time.monotonic()
    changed = cloud.admin.put(f"/vms/{spec.uuid}/tags", json={"tags": sorted(tags)})
    assert changed.status_code == 200, changed.text
    generation = cloud.lm.host_agents.generation("real-a")
    wait_for("tags in the domain", lambda: running(cloud.a.hv)[spec.uuid].tags == tags, ACT_S)
    took = time.monotonic() - started
    # The first pass of the manager that saw the change carried it out (recorded once the
    # pass ends, which can be just after the metadata was written).
    wait_for(
        "the manager's pass recorded",
        lambda: any(s.generation >= generation for s in list(cloud.a.manager.steps)),
        ACT_S,
    )
    [first] = [s for s in list(cloud.a.manager.steps) if s.generation >= generation][:1]
    assert first.retagged == [spec.uuid], first
    conn = libvirt.open(cloud.a.daemon.uri)
    try:
        config = conn.lookupByUUIDString(spec.uuid).metadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, libvirt.VIR_DOMAIN_AFFECT_CONFIG
        )
    finally:
        conn.close()
    assert parse_metadata(config)[0] == tags  # and in the persistent definition
    print(f"API tags to domain metadata: {took:.2f} s")


def test_sla_agent_balloons_and_tunes_a_vm_launched_from_a_claim(
    cloud: RealCloud, pair: tuple[GuestSpec, GuestSpec], tmp_path: Path
) -> None:
    """The SLA loop on real-a, as ``loadmaster agent --url`` runs it beside the manager
    (same hypervisor connection, reports carrying the manager's context), the host under
    memory pressure from a /proc fixture. The tiers come from the API's tags."""
    capped, platinum = pair
    assert cloud.running_on(capped.uuid, cloud.a) and cloud.running_on(platinum.uuid, cloud.a)
    tags = {"silver", "capped"}
    assert cloud.admin.put(f"/vms/{capped.uuid}/tags", json={"tags": sorted(tags)}).is_success
    wait_for("tags in the domain", lambda: running(cloud.a.hv)[capped.uuid].tags == tags, ACT_S)
    for spec in pair:
        # The policy leaves a guest out until its balloon driver has reported.
        wait_for(
            f"{spec.name} memory stats",
            lambda s=spec: "unused" in cloud.a.hv.memory_stats(s.uuid),
            BALLOON_S,
        )
    policies = Path(shutil.copytree(shipped_policy_dir(), tmp_path / "policies"))
    (policies / "90-capped.policy").write_text(CAPPED_POLICY)
    reporter = ApiClient(cloud.server.url, agent_token("real-a"), timeout=30.0)
    hv = cloud.a.hv
    full = GUEST_MIB * MIB
    try:
        agent = Agent(
            hv,
            policies,
            0.0,
            proc_root=pressured_proc(tmp_path / "proc"),
            host_name="real-a",
            reporter=reporter.report,
            report_context=cloud.a.manager.report_context,
        )
        targets: list[int] = []
        for cycle in range(1, 4):
            started = time.monotonic()
            report = agent.run_cycle()
            assert report.policy_error is None and not report.failures, report
            assert report.reported and not report.left_out, report
            targets += [
                int(a.value)
                for a in report.actions
                if a.uuid == capped.uuid and a.control == "balloon_target"
            ]
            assert targets, f"cycle {cycle}: no balloon target for the silver guest"
            reached = wait_for(
                "balloon target in QEMU",
                lambda t=targets[-1]: actual_balloon(hv, capped.uuid) == t,
                BALLOON_S,
            )
            wait_for("balloon settling", lambda: settled(hv, capped.uuid), 10)
            # Platinum: never ballooned, whatever the pressure.
            assert actual_balloon(hv, platinum.uuid) == full, f"cycle {cycle}"
            print(
                f"cycle {cycle}: target {targets[-1] // MIB} MiB, actual reached "
                f"{reached:.1f} s after the cycle ({time.monotonic() - started:.1f} s total)"
            )
        # Shrunk, within silver's guarantee (50 %).
        assert 0.5 * full <= actual_balloon(hv, capped.uuid) < full
        tune = hv.cpu_tune(capped.uuid)
        assert (tune.quota, tune.period, tune.shares) == (50_000, 100_000, 512)
        untouched = hv.cpu_tune(platinum.uuid)
        assert (untouched.quota, untouched.shares) == (-1, 1024)
        # The reports (the manager's context included) ended nothing.
        assert cloud.running_on(capped.uuid, cloud.a) and cloud.running_on(platinum.uuid, cloud.a)
        cloud.assert_clean()
    finally:
        reporter.close()


def test_sla_policy_moves_a_vapor_vm_through_the_scheduler_and_the_agents(
    cloud: RealCloud, pair: tuple[GuestSpec, GuestSpec], tmp_path: Path
) -> None:
    """Under memory pressure the shipped policy asks to move the vapor VM; the request
    goes to the API as the agent sends it, the scheduler picks the destination (the only
    other host), and the managers carry out the live migration."""
    spec = pair[0]
    assert cloud.running_on(spec.uuid, cloud.a)
    assert cloud.admin.put(f"/vms/{spec.uuid}/tags", json={"tags": ["vapor"]}).is_success
    wait_for("tags in the domain", lambda: running(cloud.a.hv)[spec.uuid].tags == {"vapor"}, ACT_S)
    client = ApiClient(cloud.server.url, agent_token("real-a"), timeout=30.0)
    try:
        agent = Agent(
            cloud.a.hv,
            shipped_policy_dir(),
            0.0,
            proc_root=pressured_proc(tmp_path / "proc"),
            host_name="real-a",
            reporter=client.report,
            migration_sender=client.request_migration,
            report_context=cloud.a.manager.report_context,
        )
        started = time.monotonic()
        report = agent.run_cycle()
        assert [(a.control, a.uuid) for a in report.actions if a.control == "migrate"] == [
            ("migrate", spec.uuid)
        ], report
        wait_for("the migration completed", lambda: cloud.running_on(spec.uuid, cloud.b), ACT_S)
    finally:
        client.close()
    took = time.monotonic() - started
    print(f"SLA-requested live migration, policy cycle to completed: {took:.1f} s")
    assert cloud.where_running(spec.uuid) == ["real-b"]
    assert cloud.records(spec.uuid, cloud.a) == []
    assert cloud.records(spec.uuid, cloud.b) == ["active"]
    assert serial(cloud.real, spec).count("lm-guest: up") == 1
    cloud.assert_clean()


def test_live_migration_carried_out_by_the_agents(
    cloud: RealCloud, pair: tuple[GuestSpec, GuestSpec]
) -> None:
    """Requested through the API, from wherever the VM runs to the other host."""
    spec = pair[0]
    source, dest = (
        (cloud.a, cloud.b) if cloud.running_on(spec.uuid, cloud.a) else (cloud.b, cloud.a)
    )
    assert cloud.running_on(spec.uuid, source)
    balloon = actual_balloon(source.hv, spec.uuid)
    started = time.monotonic()
    asked = cloud.admin.post(f"/vms/{spec.uuid}/migrate", json={"host": dest.name})
    assert asked.status_code == 200, asked.text
    assert cloud.records(spec.uuid, dest) == ["pending"]
    wait_for("the migration completed", lambda: cloud.running_on(spec.uuid, dest), ACT_S)
    took = time.monotonic() - started
    print(f"live migration through the agents, request to completed: {took:.1f} s")
    assert cloud.where_running(spec.uuid) == [dest.name]
    assert not defined(source.daemon, spec.uuid)
    assert cloud.records(spec.uuid, source) == []
    assert cloud.records(spec.uuid, dest) == ["active"]
    # Live: the same guest (booted once), its balloon kept, its tags with it.
    assert serial(cloud.real, spec).count("lm-guest: up") == 1
    assert actual_balloon(dest.hv, spec.uuid) == balloon
    assert running(dest.hv)[spec.uuid].managed
    assert cloud.vm(spec.uuid)["fault"] is None
    cloud.assert_clean()


def test_failed_migration_rolls_back(cloud: RealCloud, pair: tuple[GuestSpec, GuestSpec]) -> None:
    """real-b refuses the guest as libvirt does when a different domain of that name is
    defined there."""
    spec = pair[1]
    assert cloud.running_on(spec.uuid, cloud.a)
    conn = libvirt.open(cloud.b.daemon.uri)
    try:
        squatter = conn.defineXML(
            f"<domain type='qemu'><name>{spec.name}</name><memory>65536</memory>"
            "<os><type arch='x86_64' machine='pc'>hvm</type></os></domain>"
        )
        started = time.monotonic()
        asked = cloud.admin.post(f"/vms/{spec.uuid}/migrate", json={"host": "real-b"})
        assert asked.status_code == 200, asked.text
        wait_for("the failure heard", lambda: cloud.vm(spec.uuid)["fault"] is not None, ACT_S)
        print(
            f"failed migration rolled back through the agents: {time.monotonic() - started:.1f} s"
        )
        # The agent on real-b must leave a domain it did not launch alone.
        time.sleep(1.5)
        assert conn.lookupByName(spec.name).UUIDString() == squatter.UUIDString()
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            squatter.undefine()
        conn.close()
    vm = cloud.vm(spec.uuid)
    assert (vm["state"], vm["host"], vm["target_host"]) == ("running", "real-a", None)
    assert f"migration to {cloud.b.daemon.uri} failed" in vm["fault"]
    assert "live migration failed" in vm["fault"]
    assert cloud.where_running(spec.uuid) == ["real-a"]
    assert not defined(cloud.b.daemon, spec.uuid)
    assert cloud.records(spec.uuid, cloud.b) == []
    assert cloud.records(spec.uuid, cloud.a) == ["active"]
    # Alive, not only listed: its balloon driver answers on the source.
    cloud.a.hv.set_memory(spec.uuid, 100 * MIB)
    wait_for(
        "balloon after the rollback",
        lambda: actual_balloon(cloud.a.hv, spec.uuid) == 100 * MIB,
        BALLOON_S,
    )
    cloud.assert_clean()


def test_stop_and_delete_remove_the_guests(
    cloud: RealCloud, pair: tuple[GuestSpec, GuestSpec]
) -> None:
    deleted, stopped = pair
    where = {
        spec.uuid: cloud.a if cloud.running_on(spec.uuid, cloud.a) else cloud.b for spec in pair
    }
    started = time.monotonic()
    assert cloud.admin.post(f"/vms/{stopped.uuid}/stop").status_code == 200
    assert cloud.admin.delete(f"/vms/{deleted.uuid}").status_code == 204
    for spec in pair:
        daemon = where[spec.uuid].daemon
        wait_for(
            f"{spec.name} gone from libvirt",
            lambda s=spec, d=daemon: not defined(d, s.uuid),
            STOP_S,
        )
    print(f"stop and delete carried out: {time.monotonic() - started:.1f} s")
    assert cloud.where_running(stopped.uuid) == cloud.where_running(deleted.uuid) == []
    assert cloud.vm(stopped.uuid)["state"] == "stopped"
    assert cloud.lm.allocations.allocations(vm=stopped.uuid) == []
    assert cloud.lm.allocations.allocations(vm=deleted.uuid) == []
    cloud.assert_clean()


def test_the_agent_command_takes_over_a_host_and_launches_on_qemu(
    cloud: RealCloud, tmp_path: Path
) -> None:
    """``loadmaster agent`` replaces real-b's manager (as after a restart): it finds the
    host by name and launches a VM claimed there while no agent ran, on QEMU, booting the
    guest kernel it was given on the command line with its root on a disk made from the
    image the VM names, found in the agent's --image-dir, and a NIC with the ledger's MAC.
    Last: it ends real-b's manager."""
    cloud.b.halt()
    images = cloud.real.images
    added = CliRunner().invoke(
        app,
        [
            *("image", "add", "busybox", str(images / "busybox.qcow2")),
            *("--url", cloud.server.url, "--token", ADMIN_TOKEN),
        ],
    )
    assert added.exit_code == 0, added.output
    spec = cloud.create_vm("gold", image="busybox")
    [nic] = cloud.vm(spec.uuid)["nics"]
    claimed = cloud.admin.put(f"/vms/{spec.uuid}/allocations", json={"host": "real-b"})
    assert claimed.status_code == 200, claimed.text
    image = cloud.real.image
    assert image.log_dir is not None
    started = time.monotonic()
    result = CliRunner().invoke(
        app,
        [
            "agent",
            "--hypervisor",
            cloud.b.daemon.uri,
            "--policy-dir",
            str(shipped_policy_dir()),
            "--url",
            cloud.server.url,
            "--token",
            agent_token("real-b"),
            "--host-name",
            "real-b",
            # The agent ends once its cycles are done and its launches announced.
            "--cycles",
            "2",
            "--interval",
            "1",
            "--sys-root",
            str(fixture_sys(tmp_path / "sys")),
            "--guest-kernel",
            str(image.kernel),
            "--guest-initrd",
            str(image.initrd),
            "--guest-console-dir",
            str(image.log_dir),
            "--migration-data-uri",
            "tcp://127.0.0.1",
            "--image-dir",
            str(images),
        ],
    )
    assert result.exit_code == 0, result.output
    # Its manager ended with it: nothing acts on real-b, or waits on the API, behind it.
    assert not [t for t in threading.enumerate() if t.name == "host-manager"]
    assert cloud.running_on(spec.uuid, cloud.b), cloud.vm(spec.uuid)
    print(f"loadmaster agent: claim to up in one run of {time.monotonic() - started:.1f} s")
    guest = running(cloud.b.hv)[spec.uuid]
    assert guest.managed and guest.tags == {"gold"}
    booted(cloud.real, spec)
    console = serial(cloud.real, spec)
    assert "lm-guest: root on /dev/vda" in console
    assert f"lm-guest: eth0 {nic['mac']}" in console
    [disk] = cloud.vm(spec.uuid)["disks"]
    assert disk["volume"] == f"loadmaster/{spec.uuid}.qcow2"
    assert f"{spec.uuid}.qcow2" in cloud.b.hv.storage.pool().listVolumes()
    assert cloud.vm(spec.uuid)["fault"] is None
    assert cloud.records(spec.uuid, cloud.b) == ["active"]
    cloud.assert_clean()
