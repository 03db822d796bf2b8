"""A real host dies (issue #26): host ``real-c`` is a private libvirtd of its own with a
highly available QEMU guest on it; the daemon and the guest are killed (SIGKILL, as a
power loss), its agent falls silent, and the server (in-process, with a fence command
that confirms the daemon is gone) fences it and evacuates the guest to ``real-a``, the
session's first daemon, whose agent boots it there. Then ``real-c`` comes back with the
guest running again behind the ledger's back (a host that was cut off, not powered off):
its agent stops it, the host stays down, and the VM runs once, on real-a.

Timings are printed (``pytest -s``) for the closing note of issue #26.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from realvm_helpers import (
    PrivateLibvirtd,
    RealHosts,
    booted,
    fixture_sys,
    new_spec,
    running,
    share_capabilities_cache,
    start_daemon,
    start_network,
    stop_daemon,
    wait_for,
    wait_ready,
)
from sqlalchemy import select

import loadmaster
from loadmaster.agent.hypervisor.base import HypervisorError
from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor
from loadmaster.agent.manager.host_manager import HostManager, ManagerConfig
from loadmaster.agent.runner import ApiClient
from loadmaster.api import AuthConfig, create_app
from loadmaster.api.server import serve_in_thread
from loadmaster.demo.cloud import ADMIN_TOKEN, agent_token
from loadmaster.heartbeat import flush_every
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.pending import audit
from loadmaster.service import Loadmaster
from loadmaster.settings_model import Settings
from loadmaster.store.locking import now
from loadmaster.store.schema import HostAgentRow, HostRow

pytestmark = [pytest.mark.realvm, pytest.mark.xdist_group("realvm")]

GUEST_MIB = 128
SILENT_S = 8.0
# Held polls recorded this often: the least that allows the threshold above.
HEARD_EVERY_S = 2.0
# The server's pass: a quarter of the threshold.
PASS_S = 2.0
# A launch and a TCG boot on 2 shared cores: generous.
ACT_S = 60.0
# Death to the claim on the other host: the threshold, a liveness flush, one pass, and
# the seconds a loaded 2-core machine adds to the fence and the placement.
PLACED_S = SILENT_S + flush_every(HEARD_EVERY_S) + PASS_S + 3.0


@dataclass
class Agent:
    """A host manager running in a thread until ``halt``."""

    name: str
    hv: LibvirtHypervisor
    manager: HostManager
    client: ApiClient
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @classmethod
    def start(
        cls, name: str, daemon: PrivateLibvirtd, real: RealHosts, url: str, sys_root: Path
    ) -> Agent:
        hv = real.hypervisor(daemon, sys_root=sys_root)
        client = ApiClient(url, agent_token(name), timeout=30.0)
        manager = HostManager(
            hv, client, ManagerConfig(), host_name=name, hypervisor_uri=daemon.uri
        )
        agent = cls(name, hv, manager, client)
        manager.register()
        agent.thread = threading.Thread(
            target=manager.run_forever, args=(agent.stop,), kwargs={"wait": 1.0}, daemon=True
        )
        agent.thread.start()
        return agent

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=30)
        with contextlib.suppress(Exception):  # its libvirtd may be dead
            self.manager.close()
        self.client.close()
        with contextlib.suppress(Exception):
            self.hv.close()


def _power_off(daemon: PrivateLibvirtd) -> None:
    """SIGKILL the daemon's guests and the daemon itself: nothing is shut down cleanly."""
    for pid_file in daemon.base.glob("run/qemu/*.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.process.pid, signal.SIGKILL)
    daemon.process.wait(timeout=30)


def _fence_script(scratch: Path, daemon: PrivateLibvirtd) -> Path:
    """Power management's answer: fenced (exit 0) once the host's daemon is gone."""
    script = scratch / "fence.sh"
    script.write_text(
        f'#!/bin/sh\necho "$1 $(date +%s.%N)" >> {scratch / "fenced.log"}\n'
        f"if kill -0 {daemon.process.pid} 2>/dev/null; then echo still powered >&2; exit 1; fi\n"
    )
    script.chmod(0o755)
    return script


def _phases(lm: Loadmaster, vm: str, died_at: datetime, fenced_s: float) -> dict[str, float]:
    """Seconds from the death: to the agent's last word, the fence, the claim on real-a
    and its agent's ``up`` (from the ledger's events)."""
    with lm.store.read() as session:
        heard = session.scalar(
            select(HostAgentRow.last_seen_at)
            .join(HostRow, HostRow.id == HostAgentRow.host_id)
            .where(HostRow.name == "real-c")
        )
    assert heard is not None
    events = [e for e in lm.vms.events(vm=vm) if e.at >= died_at and e.host == "real-a"]
    placed = next(e.at for e in events)
    up = next(e.at for e in events if e.state == "running")
    return {
        "last heard": (heard - died_at).total_seconds(),
        "fenced": fenced_s,
        "placed on real-a": (placed - died_at).total_seconds(),
        "up there": (up - died_at).total_seconds(),
    }


def test_a_dead_hosts_ha_vm_runs_once_on_another_host(real_hosts: RealHosts) -> None:
    # Unix socket paths are limited to 108 bytes: a short scratch directory.
    scratch = Path(tempfile.mkdtemp(prefix="lm-ev-"))
    share_capabilities_cache(real_hosts.a, scratch / "c")
    daemons: list[PrivateLibvirtd] = [start_daemon("c", f"ev{os.getpid()}", scratch)]
    agents: dict[str, Agent] = {}
    spec = new_spec(GUEST_MIB, "ha")
    settings = Settings(
        fence_command=str(_fence_script(scratch, daemons[0])),
        agent_silent_after=SILENT_S,
        agent_heard_every=HEARD_EVERY_S,
    )
    lm = loadmaster.open(f"sqlite:///{scratch / 'loadmaster.db'}", settings=settings)
    tokens = {ADMIN_TOKEN: "admin", **{agent_token(n): f"agent:{n}" for n in ("real-a", "real-c")}}
    app = create_app(lm, AuthConfig(tokens))
    server = None
    # real-a's guests seen through a connection of the test's own: the agent's is its
    # thread's, and asked from here meanwhile it once listed no guest (CI: booted, none).
    watcher = real_hosts.hypervisor(real_hosts.a)
    try:
        wait_ready(daemons[0], scratch)
        start_network(daemons[0], f"ev{os.getpid()}")
        server = serve_in_thread(app)
        admin = httpx.Client(
            base_url=server.url,
            headers={**CLIENT_HEADERS, "Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=60,
        )
        for name, daemon in (("real-a", real_hosts.a), ("real-c", daemons[0])):
            agents[name] = Agent.start(
                name, daemon, real_hosts, server.url, fixture_sys(scratch / f"{name}-sys")
            )
        flavor = {"name": "rv128", "resources": {"VCPU": 1, "MEMORY_MB": GUEST_MIB}}
        assert admin.post("/flavors", json=flavor).status_code == 201
        body = {"name": spec.name, "uuid": spec.uuid, "flavor": "rv128", "tags": ["ha"]}
        assert admin.post("/vms", json=body).status_code == 201
        claimed = admin.put(f"/vms/{spec.uuid}/allocations", json={"host": "real-c"})
        assert claimed.status_code == 200, claimed.text
        booted(real_hosts, spec)
        wait_for("running on real-c", lambda: lm.vms.get(spec.uuid).state == "running", ACT_S)
        assert real_hosts.image.log_dir is not None
        (real_hosts.image.log_dir / f"{spec.name}.serial").unlink()  # the next boot writes anew

        died, died_at, died_wall = time.monotonic(), now(), time.time()
        agents["real-c"].stop.set()  # the agent dies with its host
        _power_off(daemons[0])
        agents.pop("real-c").halt()
        bound = PLACED_S + ACT_S

        def moved() -> bool:
            vm = lm.vms.get(spec.uuid)
            return vm.state == "running" and vm.host == "real-a"

        wait_for("the HA VM running on real-a", moved, bound)
        in_ledger = time.monotonic() - died
        booted(real_hosts, spec)
        up = time.monotonic() - died
        fenced = (scratch / "fenced.log").read_text().split()
        assert fenced[::2] == ["real-c"]
        phases = _phases(lm, spec.uuid, died_at, float(fenced[1]) - died_wall)
        print(", ".join(f"{what} {at:.1f} s" for what, at in phases.items()))
        # Silent for the threshold (its last word written at most a flush late), found by
        # the next pass, fenced and placed: the claim on real-a is made by then, plus what
        # a loaded machine adds. The launch and boot then take what QEMU takes.
        assert phases["placed on real-a"] <= PLACED_S, phases
        assert lm.hosts.get("real-c").state == "down"
        assert spec.uuid in running(watcher)
        assert lm.allocations.allocations(host="real-c") == []
        assert audit(lm.store) == []

        # real-c comes back, still running the guest (it had been cut off, not powered off).
        stop_daemon(daemons[0])
        share_capabilities_cache(real_hosts.a, scratch / "c")
        daemons[0] = start_daemon("c", f"ev{os.getpid()}b", scratch)
        wait_ready(daemons[0], scratch)
        start_network(daemons[0], f"ev{os.getpid()}")
        back = real_hosts.hypervisor(daemons[0])
        try:
            back.launch_guest(spec)
            assert spec.uuid in running(back)
            agents["real-c"] = Agent.start(
                "real-c", daemons[0], real_hosts, server.url, scratch / "real-c-sys"
            )
            wait_for(
                "real-c's agent stops the moved guest",
                lambda: spec.uuid not in running(back),
                ACT_S,
            )
        finally:
            back.close()
        assert lm.hosts.get("real-c").state == "down"
        vm = lm.vms.get(spec.uuid)
        assert (vm.state, vm.host) == ("running", "real-a")
        assert spec.uuid in running(watcher)
        assert audit(lm.store) == []
        print(
            f"host killed -> fenced and HA VM running on real-a in the ledger: {in_ledger:.1f} s, "
            f"its guest booted there: {up:.1f} s (threshold {SILENT_S:g} s, pass {PASS_S:g} s)"
        )
        admin.close()
    finally:
        for agent in agents.values():
            agent.halt()
        with contextlib.suppress(HypervisorError):
            cleaner = real_hosts.hypervisor(real_hosts.a)
            with contextlib.suppress(HypervisorError):
                cleaner.remove_guest(spec.uuid)
            cleaner.close()
        watcher.close()
        if server is not None:
            server.stop()
        lm.close()
        for daemon in daemons:
            stop_daemon(daemon)
        shutil.rmtree(scratch, ignore_errors=True)
