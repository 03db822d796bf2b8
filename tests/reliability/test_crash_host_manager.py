"""kill -9 the host's manager mid-launch and mid-migration: restarted, it converges, and
nothing is left half done or double-counted.

Everything is real but the hypervisor: the loadmaster API over HTTP (in this process, on
SQLite), and per host a private ``libvirtd`` serving libvirt's test driver (the guests
live in the daemon and outlive the agents) managed by a real ``loadmaster agent --url``
process with a token bound to its host. The test driver cannot live-migrate: a move is
the cold one (define and start on the destination, then destroy and undefine on the
source), whose steps a kill can split.

The kills are synchronised on what can be observed (the ledger's counts, the daemons'
domain lists), at random points of the work in flight, and each is followed by a
restart. The narrow windows between two hypervisor calls, which a random kill rarely
hits, are also left on the daemons exactly as a kill there leaves them before the agent
comes back: a launch defined but not started, or started but never announced; a cold
move defined on the destination, started there (the guest runs twice), or stopped on the
source but not undefined. In the end every VM runs exactly once, where the ledger says, with active
records on that host only, no fault (no VM given up), no stopped definition left behind
on either daemon, and a clean audit.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import libvirt
import pytest
from libvirt_daemons import test_driver_daemon

import loadmaster
from loadmaster.agent.hypervisor.base import GuestSpec
from loadmaster.agent.hypervisor.libvirt import domain_xml
from loadmaster.api import AuthConfig, create_app
from loadmaster.api.server import serve_in_thread
from loadmaster.cluster import VmSpec
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.pending import audit
from loadmaster.scheduler import RequestSpec
from loadmaster.scheduler.core.filters.live_agent import UNLISTED
from loadmaster.service import Loadmaster

pytestmark = pytest.mark.slow

LOADMASTER = str(Path(sys.executable).parent / "loadmaster")
ADMIN = "crash-admin"
HOSTS = ("host-a", "host-b")
VMS = 150
MOVED = 40
LAUNCH_KILLS = 4
MIGRATION_KILLS = 3
WAIT_S = 60.0
# Small guests; VCPU overcommitted so that 150 fit the test driver's 16 CPUs.
FLAVOR = {"name": "tiny", "resources": {"VCPU": 1, "MEMORY_MB": 8}}
FLAVOR_MEMORY_KIB = 8 * 1024
AGENT_CONFIG = "[allocation_ratio]\nVCPU = 16.0\n"


def token(host: str) -> str:
    return f"crash-agent-{host}"


@dataclass
class Host:
    name: str
    uri: str
    conn: Any  # the test's own connection: keeps the daemon's default host alive
    command: list[str]
    log: Path
    agent: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        assert self.agent is None
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts}\n".encode())
            out.flush()
            self.agent = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.agent is not None
        assert self.agent.poll() is None, f"the agent of {self.name} exited: {self.tail()}"
        self.agent.send_signal(signal.SIGKILL)
        self.agent.wait()
        assert self.agent.returncode == -signal.SIGKILL
        self.agent = None

    def stop(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGKILL)
            self.agent.wait()
        self.agent = None

    def check_alive(self) -> None:
        assert self.agent is not None and self.agent.poll() is None, (
            f"the agent of {self.name} exited: {self.tail()}"
        )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def domains(self) -> tuple[set[str], set[str]]:
        """(running, defined but not running) UUIDs, the driver's own guest left out."""
        # Names and UUIDs come with the listing: two calls to the daemon, whatever the count.
        return tuple(  # type: ignore[return-value]
            {d.UUIDString() for d in self.conn.listAllDomains(flags) if d.name() != "test"}
            for flags in (
                libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE,
                libvirt.VIR_CONNECT_LIST_DOMAINS_INACTIVE,
            )
        )


@dataclass
class Cloud:
    lm: Loadmaster
    admin: httpx.Client
    hosts: dict[str, Host]
    kills: list[str] = field(default_factory=list)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for host in self.hosts.values():
                if host.agent is not None:
                    host.check_alive()
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)

    def states(self, uuids: list[str]) -> dict[tuple[str, str | None], int]:
        wanted = set(uuids)
        counts: dict[tuple[str, str | None], int] = {}
        for vm in self.lm.vms.list():
            if vm.uuid in wanted:
                key = (vm.state, vm.host)
                counts[key] = counts.get(key, 0) + 1
        return counts


@pytest.fixture
def crash_cloud(tmp_path: Path) -> Iterator[Cloud]:
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'loadmaster.db'}")
    tokens = {ADMIN: "admin", **{token(h): f"agent:{h}" for h in HOSTS}}
    server = serve_in_thread(create_app(lm, AuthConfig(tokens)))
    admin = httpx.Client(
        base_url=server.url,
        headers={**CLIENT_HEADERS, "Authorization": f"Bearer {ADMIN}"},
        timeout=60,
    )
    policy_dir = tmp_path / "policy"  # no policy: the manager is the subject
    policy_dir.mkdir()
    config = tmp_path / "agent.toml"
    config.write_text(AGENT_CONFIG)
    hosts: dict[str, Host] = {}
    try:
        with (
            test_driver_daemon(tmp_path / "libvirtd-a") as uri_a,
            test_driver_daemon(tmp_path / "libvirtd-b") as uri_b,
        ):
            for name, uri in zip(HOSTS, (uri_a, uri_b), strict=True):
                command = [
                    LOADMASTER,
                    "agent",
                    "--hypervisor",
                    uri,
                    "--policy-dir",
                    str(policy_dir),
                    "--url",
                    server.url,
                    "--token",
                    token(name),
                    "--host-name",
                    name,
                    "--interval",
                    "1",
                    "--config",
                    str(config),
                ]
                hosts[name] = Host(name, uri, libvirt.open(uri), command, tmp_path / f"{name}.log")
            try:
                yield Cloud(lm, admin, hosts)
            finally:
                for host in hosts.values():
                    host.stop()
                for host in hosts.values():
                    host.conn.close()
    finally:
        admin.close()
        server.stop()
        lm.close()


def test_agent_killed_mid_launch_and_mid_migration_converges(crash_cloud: Cloud) -> None:
    c = crash_cloud
    a, b = c.hosts["host-a"], c.hosts["host-b"]
    rng = random.Random(10)
    started = time.monotonic()
    assert c.admin.post("/flavors", json=FLAVOR).status_code == 201
    a.start()
    b.start()
    c.wait_for(lambda: all(_listed(c, h) for h in HOSTS), "both hosts' lists read")
    uuids = [
        vm.uuid for vm in c.lm.vms.create_many([VmSpec(f"vm-{i:03d}", "tiny") for i in range(VMS)])
    ]

    # -- mid-launch: the mass start on A, its agent killed at rising random points --------
    a.kill()  # registered; it comes back to a mass start
    launch_started = time.monotonic()
    request = {"vms": uuids, "include_hosts": ["host-a"]}
    answer = c.admin.post("/schedule", json={"requests": [request]})
    assert answer.status_code == 200, answer.text
    assert {p["host"] for p in answer.json()["placements"]} == {"host-a"}
    # The windows a random kill rarely hits, left as a kill there leaves them: two guests
    # defined but not started, one started but never announced.
    for vm in uuids[:3]:
        spec = GuestSpec(vm, c.lm.vms.get(vm).name, FLAVOR_MEMORY_KIB, 1)
        dom = a.conn.defineXML(domain_xml(spec, "TEST", None))
        if vm == uuids[2]:
            dom.create()
    a.start()
    for left in range(LAUNCH_KILLS, 0, -1):
        up = _running(c, uuids, "host-a")
        # Somewhere in this kill's share of what is left, at least one more VM up first.
        mark = up + rng.randint(1, max(1, (VMS - up) // (left + 1)))
        c.wait_for(lambda m=mark: _running(c, uuids, "host-a") >= m, f"{mark} VMs up")
        a.kill()
        running, stopped = a.domains()
        up = _running(c, uuids, "host-a")
        c.kills.append(
            f"{time.monotonic() - launch_started:.1f} s into the mass start: killed at "
            f"{up}/{VMS} up in the ledger, {len(running)} running and {len(stopped)} "
            "defined but not started on the daemon"
        )
        assert up < VMS, f"every VM was up before the kill: {c.kills}"
        a.start()
    c.wait_for(lambda: _running(c, uuids, "host-a") == VMS, f"all {VMS} running")
    launch_s = time.monotonic() - launch_started
    _converged(c, {vm: "host-a" for vm in uuids})

    # -- mid-migration: a batch moves to B, A's agent killed while the moves run --------
    moving = rng.sample(uuids, MOVED)
    a.kill()  # idle: it comes back to a batch of moves
    migration_started = time.monotonic()
    for vm in moving:
        answer = c.admin.post(f"/vms/{vm}/migrate", json={"host": "host-b"})
        assert answer.status_code == 200, answer.text
    # As above: cold moves killed after defining the guest on B, after starting it there
    # (it runs on both), and after stopping it here (its definition left behind).
    for i, vm in enumerate(moving[:3]):
        here = a.conn.lookupByUUIDString(vm)
        there = b.conn.defineXML(here.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        if i >= 1:
            there.create()
        if i == 2:
            here.destroy()
    a.start()
    for left in range(MIGRATION_KILLS, 0, -1):
        moved = len(set(moving) & b.domains()[0])
        mark = moved + rng.randint(1, max(1, (MOVED - moved) // (left + 1)))
        c.wait_for(lambda m=mark: len(set(moving) & b.domains()[0]) >= m, f"{mark} moved")
        a.kill()
        on_a, stopped_a = a.domains()
        on_b, stopped_b = b.domains()
        done = _running(c, moving, "host-b")
        c.kills.append(
            f"{time.monotonic() - migration_started:.1f} s into the moves: killed with "
            f"{len(set(moving) & on_b)}/{MOVED} running on B ({done} completed in the "
            f"ledger, {len(set(moving) & on_a & on_b)} running on both, "
            f"{len(set(moving) & stopped_a)} stopped definitions left on A, "
            f"{len(set(moving) & stopped_b)} on B)"
        )
        assert done < MOVED, f"every move had completed before the kill: {c.kills}"
        a.start()
    c.wait_for(lambda: _running(c, moving, "host-b") == MOVED, f"all {MOVED} moved")
    migration_s = time.monotonic() - migration_started
    expected = {vm: "host-a" for vm in uuids} | {vm: "host-b" for vm in moving}
    _converged(c, expected)
    print(
        *c.kills,
        f"launch {launch_s:.1f} s, migration {migration_s:.1f} s, "
        f"total {time.monotonic() - started:.1f} s",
        sep="\n",
    )


def _registered(c: Cloud, host: str) -> bool:
    """The agent's registration is done: its host exists and so does its agent row (two
    transactions: an agent killed between them leaves a host without an agent, which the
    live-agent filter rightly refuses, and this test failed so once)."""
    if host not in {h.name for h in c.lm.hosts.list()}:
        return False
    return c.lm.host_agents.status(host).status != "none"


def _listed(c: Cloud, host: str) -> bool:
    """Registered, and its host manager has read its work list since it started: only then
    may the scheduler choose the host (the live-agent filter). An agent killed after its
    registration but before its first read left host-a with no placement, and this test
    failed so once under load."""
    if not _registered(c, host):
        return False
    explained = c.lm.scheduler.explain(RequestSpec(flavor="tiny", include_hosts=[host]))
    return UNLISTED not in explained.message


def _running(c: Cloud, uuids: list[str], host: str) -> int:
    return c.states(uuids).get(("running", host), 0)


def _converged(c: Cloud, expected: dict[str, str]) -> None:
    """Every VM runs exactly once, where the ledger says, its records active there only;
    no VM was given up; nothing is left stopped on a daemon; the audit is clean. Checked
    again after a while: nothing undoes it."""
    for attempt in range(2):
        if attempt:
            time.sleep(2.0)  # a few more passes and reports of both agents
        domains = {name: host.domains() for name, host in c.hosts.items()}
        for name, (running, stopped) in domains.items():
            assert running == {vm for vm, h in expected.items() if h == name}, name
            assert stopped == set(), f"stopped definitions left on {name}"
        for vm in c.lm.vms.list():
            assert (vm.state, vm.host, vm.target_host) == ("running", expected[vm.uuid], None)
            assert vm.fault is None, (vm.uuid, vm.fault)
        for record in c.lm.allocations.allocations():
            host = expected[record.vm]
            assert record.state == "active", record
            assert record.host == host or record.host.startswith(f"{host}_numa"), record
        per_vm: dict[str, int] = {}
        for record in c.lm.allocations.allocations():
            per_vm[record.vm] = per_vm.get(record.vm, 0) + 1
        assert set(per_vm.values()) == {2}, "one VCPU and one MEMORY_MB record per VM"
        assert audit(c.lm.store) == []
