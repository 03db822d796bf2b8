"""The main job's story, on a simulated cloud with real agents:

1. **Mass start.** Hundreds of VMs (SLA tiers, priorities, server groups) are placed in
   batches: each placement is a pending claim. The hosts' agents learn of their claims
   (long-poll), launch the guests (some hosts slowly) and say ``up``: pending -> active.
2. **Memory pressure.** The guests' demand rises on hosts packed past their physical
   memory. Each host's SLA policy balloons by tier (platinum never, gold to 75 % at
   most), turns KSM on, and asks the scheduler to move the lowest-priority vapor VMs;
   the scheduler places them, the source agents migrate them.
3. **Maintenance.** The fullest host is drained: every VM on it is placed elsewhere in
   one batch, the agents migrate them, and the host ends empty in ``maintenance``.

A sampler reads the ledger and the hypervisors every ``sample_s`` the whole time: VM
states, the memory each tier keeps against its guarantee, migrations, and broken
server-group rules (there must be none).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from loadmaster.agent.manager import ManagerConfig
from loadmaster.cluster import VmSpec
from loadmaster.demo.cloud import HostPlan, SimulatedCloud
from loadmaster.pending import audit
from loadmaster.service import Loadmaster
from loadmaster.tiers import TIERS, tier_of

# (name, vCPUs, MiB, share of the VMs)
FLAVORS = (("small", 1, 2048, 0.4), ("medium", 2, 4096, 0.4), ("large", 4, 8192, 0.2))
# (tier tag, share of the VMs); vapor VMs also get a priority 0..2.
TIER_MIX = (("platinum", 0.15), ("gold", 0.25), ("silver", 0.15), ("compute", 0.1), ("vapor", 0.35))
GROUPS = (
    ("web", "anti-affinity", None, 6),
    ("db", "affinity", None, 3),
    ("cache", "anti-affinity", 2, 10),
)
# The ledger lets a host promise 1.5 times its memory: ballooning makes the difference.
HOST_CONFIG = ManagerConfig(
    allocation_ratio={"VCPU": 4.0, "MEMORY_MB": 1.5}, resources={"DISK_GB": 2000}
)
VM_STATES = ("requested", "pending", "running", "migrating", "stopped")


@dataclass
class Sample:
    t: float
    states: dict[str, int]
    # Per tier: the smallest balloon / allocation of any of its running guests.
    tier_min: dict[str, float]
    host_memory_used: dict[str, float]
    violations: int


@dataclass
class Migration:
    vm: str
    name: str
    tier: str
    source: str
    destination: str
    started: float
    finished: float | None = None
    why: str = "policy"
    outcome: str = "in flight"


@dataclass
class DemoResult:
    hosts: list[str]
    vms: int
    samples: list[Sample] = field(default_factory=list)
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    migrations: list[Migration] = field(default_factory=list)
    mass_start_seconds: float = 0.0
    running_after_start: int = 0
    drained_host: str = ""
    drain_moved: int = 0
    drain_seconds: float = 0.0
    drain_unplaced: list[str] = field(default_factory=list)
    drain_stopped: list[str] = field(default_factory=list)
    # VMs the mass start found no host for, with the scheduler's reason.
    no_host: list[str] = field(default_factory=list)
    # Where the mass start placed each VM (by name), and the seed of each batch: the same
    # demo seed gives the same placements.
    mass_start: dict[str, str | None] = field(default_factory=dict)
    batch_seeds: list[int] = field(default_factory=list)
    drain_status: str = ""
    vapor_stopped: int = 0
    migration_requests: int = 0
    launch_refusals: int = 0
    audit_problems: list[str] = field(default_factory=list)
    violations: int = 0
    explanation: str = ""

    @property
    def peak_violations(self) -> int:
        return max((s.violations for s in self.samples), default=0)


class Sampler:
    """Reads the cloud every ``every_s`` seconds in a thread of its own."""

    def __init__(
        self,
        cloud: SimulatedCloud,
        result: DemoResult,
        violations: Callable[[Loadmaster], int],
        every_s: float,
    ) -> None:
        self.cloud = cloud
        self.result = result
        self.violations = violations
        self.every_s = every_s
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.drained: str | None = None
        self._open: dict[str, Migration] = {}
        self._thread = threading.Thread(target=self._run, name="demo-sampler", daemon=True)

    def now(self) -> float:
        return time.monotonic() - self.started

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        t = self.now()
        vms = self.cloud.lm.vms.list()
        states = Counter(v.state for v in vms)
        tier_min: dict[str, float] = {}
        used: dict[str, float] = {}
        for name, sim in self.cloud.sims.items():
            for tier, ratios in sim.balloon_ratios().items():
                tier_min[tier] = min([tier_min.get(tier, 1.0), *ratios])
            used[name] = sim.host_used_kib / sim.host_memory_kib
        self.result.samples.append(
            Sample(t, dict(states), tier_min, used, self.violations(self.cloud.lm))
        )
        for vm in vms:
            open_move = self._open.get(vm.uuid)
            if vm.state == "migrating" and open_move is None and vm.host and vm.target_host:
                why = "drain" if vm.host == self.drained else "policy"
                move = Migration(
                    vm.uuid, vm.name, tier_of(vm.tags).name, vm.host, vm.target_host, t, why=why
                )
                self._open[vm.uuid] = move
                self.result.migrations.append(move)
            elif open_move is not None and vm.state != "migrating":
                open_move.finished = t
                open_move.outcome = (
                    "done" if vm.host == open_move.destination else f"rolled back ({vm.state})"
                )
                del self._open[vm.uuid]


def build(cloud: SimulatedCloud, vm_count: int, rng: random.Random) -> list[str]:
    """Flavors, server groups and the VMs to start (created, holding nothing yet)."""
    lm = cloud.lm
    for name, vcpus, mib, _share in FLAVORS:
        lm.flavors.create(
            {"name": name, "resources": {"VCPU": vcpus, "MEMORY_MB": mib, "DISK_GB": 20}}
        )
    lm.flavors.create({"name": "giant", "resources": {"VCPU": 8, "MEMORY_MB": 512 * 1024}})
    specs: list[VmSpec] = []
    for group, policy, cap, members in GROUPS:
        lm.groups.create(group, policy, max_per_host=cap)
        specs += [
            VmSpec(f"{group}-{i}", "medium", tags=["gold"], group=group) for i in range(members)
        ]
    flavors = [f[0] for f in FLAVORS]
    weights = [f[3] for f in FLAVORS]
    tiers = [t[0] for t in TIER_MIX]
    tier_weights = [t[1] for t in TIER_MIX]
    while len(specs) < vm_count:
        tier = rng.choices(tiers, tier_weights)[0]
        tags = [tier] + ([f"priority:{rng.randrange(3)}"] if tier == "vapor" else [])
        flavor = rng.choices(flavors, weights)[0]
        specs.append(VmSpec(f"{tier}-{len(specs)}", flavor, tags=tags))
    # Groups first, each in one batch, as an operator starts a database tier together;
    # the rest in random order.
    grouped = [s for s in specs if s.group]
    others = [s for s in specs if not s.group]
    rng.shuffle(others)
    return [vm.uuid for vm in lm.vms.create_many(grouped + others)]


def wait_until(condition: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def run(
    lm: Loadmaster,
    *,
    hosts: int,
    vms: int,
    seed: int,
    cycle_s: float,
    ramp_cycles: int,
    violations: Callable[[Loadmaster], int],
    progress: Callable[[str], None],
    slow_launch_s: float = 0.2,
) -> DemoResult:
    rng = random.Random(seed)
    names = [f"host-{i:02d}" for i in range(hosts)]
    cloud = SimulatedCloud(lm, cycle_s=cycle_s, ramp_cycles=ramp_cycles, agent_hosts=names)
    result = DemoResult(hosts=names, vms=vms)
    sampler = Sampler(cloud, result, violations, every_s=0.2)
    try:
        for i, name in enumerate(names):
            # Every third host launches slowly: its claims must survive reports meanwhile.
            delay = slow_launch_s if i % 3 == 2 else 0.0
            cloud.add_host(HostPlan(name, launch_delay=delay, config=HOST_CONFIG))
        uuids = build(cloud, vms, rng)
        sampler.start()
        progress(f"{hosts} hosts registered by their agents, {len(uuids)} VMs requested")

        began = sampler.now()
        names_of = {vm.uuid: vm.name for vm in lm.vms.list()}
        for start in range(0, len(uuids), 50):
            # Each batch's seed comes from the demo's: the scheduler's random choices
            # among equal hosts are then the same on every run.
            batch_seed = rng.randrange(2**63)
            result.batch_seeds.append(batch_seed)
            body = {
                "requests": [{"vms": uuids[start : start + 50]}],
                "policy": "pack",
                "seed": batch_seed,
            }
            answer = cloud.admin.post("/schedule", json=body)
            answer.raise_for_status()
            for p in answer.json()["placements"]:
                result.mass_start[names_of[p["vm"]]] = p["host"]
                if p.get("error"):
                    result.no_host.append(f"{names_of[p['vm']]}: {p['error']['detail']}")

        def started() -> bool:
            states = Counter(v.state for v in lm.vms.list())
            return states["pending"] == 0 and states["migrating"] == 0

        wait_until(started, 120)
        result.mass_start_seconds = sampler.now() - began
        result.running_after_start = sum(v.state == "running" for v in lm.vms.list())
        result.phases.append(("mass start", began, sampler.now()))
        progress(
            f"mass start: {result.running_after_start} VMs up in "
            f"{result.mass_start_seconds:.1f} s from the first request "
            f"({result.running_after_start / max(result.mass_start_seconds, 1e-9):.0f} VMs/s)"
        )

        pressure = sampler.now()
        # Demand peaks after ``ramp_cycles`` SLA cycles; give the policy time beyond it.
        peak = ramp_cycles + 20
        wait_until(lambda: min(h.cycles for h in cloud.hosts.values()) >= peak, peak * cycle_s * 4)
        wait_until(lambda: not lm.vms.list(state="migrating"), 60)
        result.phases.append(("memory pressure", pressure, sampler.now()))
        moved = sum(1 for m in result.migrations if m.outcome == "done")
        progress(
            f"memory pressure: {len(cloud.migration_requests)} migration requests from the "
            f"hosts' SLA policies, {moved} VMs moved"
        )

        target = _fullest(lm, names)
        sampler.drained = target
        drain_began = sampler.now()
        # Counted from the records, not from the sampler: a move that begins and ends
        # between two samples is still a move.
        on_target = {v.uuid for v in lm.vms.list(host=target)}
        drained = cloud.admin.post(f"/hosts/{target}/drain", json={})
        drained.raise_for_status()
        body = drained.json()
        result.drained_host = target
        result.drain_unplaced = [
            f"{lm.vms.get(u['vm']).name}: {u['reason']}" for u in body["unplaced"]
        ]

        def settled() -> bool:
            left = lm.vms.list(host=target)
            return len(left) <= len(result.drain_unplaced) and all(
                v.state != "migrating" for v in left
            )

        wait_until(settled, 90)
        if result.drain_unplaced:
            # What fits nowhere is stopped, as ``host drain --force`` does.
            forced = cloud.admin.post(f"/hosts/{target}/drain", json={"force": True})
            forced.raise_for_status()
            result.drain_stopped = list(forced.json()["stopped"])
            wait_until(lambda: not lm.vms.list(host=target), 30)
        result.drain_seconds = sampler.now() - drain_began
        result.drain_moved = sum(
            1
            for v in lm.vms.list(state="running")
            if v.uuid in on_target and v.host not in (None, target)
        )
        status = cloud.admin.get(f"/hosts/{target}").json()
        result.drain_status = str(status.get("status", status.get("state", "")))
        result.phases.append(("drain " + target, drain_began, sampler.now()))
        progress(
            f"drain of {target}: {result.drain_moved} VMs moved in {result.drain_seconds:.1f} s, "
            f"{len(result.drain_unplaced)} fit nowhere (stopped: {len(result.drain_stopped)}); "
            f"host {result.drain_status}"
        )
        for line in result.drain_unplaced:
            progress(f"fits nowhere: {line}")

        giant = lm.vms.create("giant-1", "giant").uuid
        answer = cloud.admin.post(f"/vms/{giant}/start")
        result.explanation = str(answer.json().get("detail", ""))
    finally:
        sampler.close()
        result.migration_requests = len(cloud.migration_requests)
        result.vapor_stopped = sum(len(s.stopped) for s in cloud.sims.values())
        cloud.close()
    result.launch_refusals = sum(1 for v in lm.vms.list() if v.fault and "launch" in v.fault)
    result.audit_problems = [f"{p.kind} {p.subject}: {p.detail}" for p in audit(lm.store)]
    result.violations = violations(lm)
    return result


def _fullest(lm: Loadmaster, names: list[str]) -> str:
    counts = Counter(v.host for v in lm.vms.list(state="running"))
    return max(names, key=lambda n: (counts.get(n, 0), n))


def tier_guarantees() -> dict[str, float]:
    return {t.name: t.memory_guarantee for t in TIERS}
