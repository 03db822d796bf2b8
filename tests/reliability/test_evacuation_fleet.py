"""Evacuation at scale (issue #26): 200 simulated hosts on two ``loadmaster serve``
processes sharing one PostgreSQL, both running the automatic evacuation with a fence
command; 20 hosts die (their agents and guests gone) while a mass start is under way.
Every VM ends up running exactly once, on a host that lives, and no anti-affinity rule is
broken at any sampled moment. The dead hosts then come back still believing they run
their old guests: their agents drop them, and nothing runs twice."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

import loadmaster
from fleet_agents import FleetStats, SimAgent
from harness import ServedApi
from loadmaster.cluster import VmSpec
from loadmaster.pending import audit, group_rule_problems

HOSTS = 200
DEAD = 20
VMS = 1000
GROUPS = 100  # anti-affinity, 5 members each: half the VMs
BATCH = 50
SILENT_AFTER_S = 30.0
# Agents' long-polls: each poll that ends is heard, well inside the silence threshold.
WAIT_S = 2.0
NODE = {"VCPU": {"total": 32}, "MEMORY_MB": {"total": 131072}}


def _fence_script(tmp_path: Path) -> Path:
    """Records each host it is asked to fence, with the time (the simulated host is off)."""
    script = tmp_path / "fence.sh"
    log = tmp_path / "fenced.log"
    script.write_text(f'#!/bin/sh\necho "$1 $(date +%s.%N)" >> {log}\n')
    script.chmod(0o755)
    return script


def _fenced(tmp_path: Path) -> list[tuple[str, float]]:
    log = tmp_path / "fenced.log"
    if not log.exists():
        return []
    return [(h, float(t)) for h, t in (line.split() for line in log.read_text().splitlines())]


class Fleet:
    """Simulated agents in an event loop of their own thread, each one killable."""

    def __init__(self) -> None:
        self.stats = FleetStats()
        self.loop = asyncio.new_event_loop()
        self.agents: dict[str, SimAgent] = {}
        self.tasks: dict[str, asyncio.Future[None]] = {}
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def start(self, server: ServedApi, host: str, running: Iterable[str] = ()) -> None:
        agent = SimAgent(server.url, server.token, host, self.stats, wait=WAIT_S)
        agent.running = set(running)
        self.agents[host] = agent
        self.tasks[host] = asyncio.run_coroutine_threadsafe(
            agent.run(time.monotonic() + 3600), self.loop
        )

    def running(self) -> dict[str, list[str]]:
        """VM uuid -> the agents whose simulated hypervisor runs it (read in their loop)."""

        async def read() -> dict[str, list[str]]:
            where: dict[str, list[str]] = {}
            for host in self.tasks:
                for vm in self.agents[host].running:
                    where.setdefault(vm, []).append(host)
            return where

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(timeout=60)

    def kill(self, host: str) -> set[str]:
        """The host dies with its guests: its agent stops mid-whatever; what it ran."""
        task = self.tasks.pop(host)
        task.cancel()
        with contextlib.suppress(concurrent.futures.CancelledError):
            task.result(timeout=60)
        return set(self.agents[host].running)

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


class Sampler:
    """Reads the committed group rules every ``every`` s until stopped; keeps problems."""

    def __init__(self, url: str, every: float = 0.5) -> None:
        self.lm = loadmaster.open(url, migrate=False)
        self.every = every
        self.samples = 0
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            found = group_rule_problems(self.lm.store)
            self.samples += 1
            self.problems += [f"{p.subject}: {p.detail}" for p in found]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.lm.close()


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``check()`` until true; the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


@pytest.mark.slow
@pytest.mark.postgres
def test_twenty_of_two_hundred_hosts_die_during_a_mass_start(pg_url: str, tmp_path: Path) -> None:
    with loadmaster.open(pg_url) as lm:
        for i in range(HOSTS):
            lm.host_agents.register(f"h{i}", hypervisor_uri=f"sim:///h{i}", inventories=NODE)
        lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
        for g in range(GROUPS):
            lm.groups.create(f"spread-{g}", "anti-affinity")
        specs = [
            VmSpec(
                f"v{i}",
                "small",
                group=f"spread-{i % GROUPS}" if i < GROUPS * 5 else None,
                tags=["ha"] if i % 3 == 0 else [],
            )
            for i in range(VMS)
        ]
        vms = [v.uuid for v in lm.vms.create_many(specs)]
    env = {
        **os.environ,
        "LOADMASTER_FENCE_COMMAND": str(_fence_script(tmp_path)),
        "LOADMASTER_AGENT_SILENT_AFTER": str(SILENT_AFTER_S),
    }
    servers: list[ServedApi] = []
    fleet: Fleet | None = None
    sampler: Sampler | None = None
    try:
        for name in ("a", "b"):
            servers.append(ServedApi(pg_url, 1, tmp_path / f"{name}.log", env))
        fleet = Fleet()
        for i in range(HOSTS):
            fleet.start(servers[i % 2], f"h{i}")
        sampler = Sampler(pg_url)
        dead = [f"h{i}" for i in range(0, HOSTS, HOSTS // DEAD)]
        held: dict[str, set[str]] = {}
        killed_at = killed_wall = 0.0
        with servers[0].client(timeout=120) as admin:
            for n, start in enumerate(range(0, VMS, BATCH)):
                if n == VMS // BATCH // 2:
                    killed_at = time.monotonic()
                    killed_wall = time.time()
                    held = {h: fleet.kill(h) for h in dead}
                batch = {"requests": [{"vms": vms[start : start + BATCH]}]}
                response = admin.post("/schedule", json=batch)
                assert response.status_code == 200, response.text
                assert not [p for p in response.json()["placements"] if p.get("error")]

        with loadmaster.open(pg_url, migrate=False) as lm:

            def settled() -> bool:
                states = lm.vms.list()
                return all(v.state == "running" and v.host not in dead for v in states)

            done = _wait_for(settled, 360, "every VM running on a live host")
            on_dead = {h for h, _ in _fenced(tmp_path)}
            assert on_dead == set(dead)  # each dead host fenced, no live one
            assert len(_fenced(tmp_path)) == DEAD  # once each, across both servers
            assert {lm.hosts.get(h).state for h in dead} == {"down"}
            assert audit(lm.store) == []

            def once() -> bool:
                where = fleet.running()
                return all(len(where.get(vm, [])) == 1 for vm in vms)

            _wait_for(once, 120, "every VM run by exactly one live host")
            # The dead hosts come back believing they still run their guests.
            for i, host in enumerate(dead):
                fleet.start(servers[i % 2], host, held[host])

            def dropped() -> bool:
                where = fleet.running()
                return all(where.get(vm, [""])[0] not in dead for vm in vms) and once()

            _wait_for(dropped, 120, "the hosts that came back dropping what moved away")
            assert {lm.hosts.get(h).state for h in dead} == {"down"}
            assert {v.state for v in lm.vms.list()} == {"running"}
            assert audit(lm.store) == []
    finally:
        if sampler is not None:
            sampler.close()
        if fleet is not None:
            fleet.close()
        for server in servers:
            server.close()
    assert sampler.samples > 20 and sampler.problems == []
    # The servers' own account of each evacuation: VMs placed, and how long it took.
    said = [
        (int(n), float(s))
        for server in ("a", "b")
        for n, s in re.findall(
            r"(\d+) VMs evacuated in ([\d.]+) s", (tmp_path / f"{server}.log").read_text()
        )
    ]
    evacuated = sum(n for n, _ in said)
    fences = sorted(t - killed_wall for _, t in _fenced(tmp_path))
    print(
        f"\n{DEAD} of {HOSTS} hosts killed mid-start: fenced {fences[0]:.1f}-{fences[-1]:.1f} s "
        f"after the kill (threshold {SILENT_AFTER_S:g} s); {evacuated} VMs evacuated, "
        f"{evacuated / sum(s for _, s in said):.0f} VMs/s while evacuating; every VM running "
        f"on a live host {done - killed_at:.1f} s after the kill; "
        f"{sampler.samples} samples of the group rules, all clean"
    )
