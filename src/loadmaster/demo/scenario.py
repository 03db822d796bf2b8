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
4. **A VM from an image.** As an operator would through the API: an image registered, a
   VM of it with a NIC created and started; ``vm show``'s disk and NIC, and what its
   host's agent gave the hypervisor.

A sampler reads the ledger and the hypervisors every ``sample_s`` the whole time, for the
charts: VM states, the memory each tier keeps against its guarantee, the hosts' memory and
broken server-group rules (there must be none). What is counted (placements, refused
launches and their retries, every migration and how it ended) comes from the ledger's
events instead (``demo.account``): a sample misses what begins and ends between two.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from loadmaster.agent.hypervisor import DiskSpec, NicSpec
from loadmaster.agent.manager import ManagerConfig
from loadmaster.cluster import VmSpec
from loadmaster.demo.account import Account, account
from loadmaster.demo.cloud import HostPlan, SimulatedCloud
from loadmaster.pending import audit
from loadmaster.service import Loadmaster
from loadmaster.store.locking import now
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
# scripts/guest-image.sh's bootable disk image, by the size its guest sees.
IMAGE = ("busybox", 32 * 1024 * 1024)
IMAGE_VM = "boot-1"


@dataclass
class Sample:
    t: float
    states: dict[str, int]
    # Per tier: the smallest balloon / allocation of any of its running guests.
    tier_min: dict[str, float]
    host_memory_used: dict[str, float]
    violations: int


@dataclass(frozen=True)
class ImageBoot:
    """The VM the demo boots from an image: as ``GET /vms/{uuid}`` answers at the end of
    the wait (``running`` unless its launch failed everywhere), the seconds from its start
    to then, and the disk and NICs its host's hypervisor was given."""

    vm: dict[str, Any]
    seconds: float
    disk: DiskSpec | None = None
    nics: tuple[NicSpec, ...] = ()


@dataclass
class DemoResult:
    hosts: list[str]
    vms: int
    samples: list[Sample] = field(default_factory=list)
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    # From the ledger's events, over the whole run.
    account: Account = field(default_factory=Account)
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
    # The SLA policies' migration requests by the server's answer (``began`` or the
    # error code that refused one).
    migration_requests: Counter[str] = field(default_factory=Counter)
    audit_problems: list[str] = field(default_factory=list)
    violations: int = 0
    explanation: str = ""
    image_boot: ImageBoot | None = None

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
        # The same moment by the ledger's clock, which stamps its events.
        self.origin: datetime = now()
        self.stop = threading.Event()
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
        created = lm.vms.list()
        names_of = {vm.uuid: vm.name for vm in created}
        tiers = {vm.uuid: tier_of(vm.tags).name for vm in created}
        drain: tuple[str, float] | None = None

        def so_far() -> Account:
            return account(lm.vms.events(), sampler.origin, tiers, drain)

        began = sampler.now()
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
                    detail = named(p["error"]["detail"], names_of)
                    result.no_host.append(f"{names_of[p['vm']]}: {detail}")

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
            f"({result.running_after_start / max(result.mass_start_seconds, 1e-9):.0f} VMs/s); "
            + refusals_line(so_far())
        )

        pressure = sampler.now()
        # Demand peaks after ``ramp_cycles`` SLA cycles; give the policy time beyond it.
        peak = ramp_cycles + 20
        wait_until(lambda: min(h.cycles for h in cloud.hosts.values()) >= peak, peak * cycle_s * 4)
        wait_until(lambda: not lm.vms.list(state="migrating"), 60)
        result.phases.append(("memory pressure", pressure, sampler.now()))
        requests = Counter(r.answer for r in list(cloud.migration_requests))
        progress("memory pressure: " + requests_line(requests, so_far()))

        target = _fullest(lm, names)
        drain_began = sampler.now()
        drain = (target, drain_began)
        drained = cloud.admin.post(f"/hosts/{target}/drain", json={})
        drained.raise_for_status()
        body = drained.json()
        result.drained_host = target
        result.drain_unplaced = [
            f"{names_of[u['vm']]}: {named(u['reason'], names_of)}" for u in body["unplaced"]
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
        result.drain_moved = so_far().outcomes("drain").get("done", 0)
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

        result.image_boot = boot_from_image(cloud)

        giant = lm.vms.create("giant-1", "giant").uuid
        names_of[giant] = "giant-1"
        answer = cloud.admin.post(f"/vms/{giant}/start")
        result.explanation = named(str(answer.json().get("detail", "")), names_of)
    finally:
        sampler.close()
        result.migration_requests = Counter(r.answer for r in list(cloud.migration_requests))
        result.vapor_stopped = sum(len(s.stopped) for s in cloud.sims.values())
        cloud.close()
    result.account = account(lm.vms.events(), sampler.origin, tiers, drain)
    result.audit_problems = [
        named(f"{p.kind} {p.subject}: {p.detail}", names_of) for p in audit(lm.store)
    ]
    result.violations = violations(lm)
    return result


def boot_from_image(cloud: SimulatedCloud) -> ImageBoot:
    """Register ``IMAGE``, create ``IMAGE_VM`` of it with a NIC on ``default`` and start
    it, through the API as ``image add``, ``vm create`` and ``vm start`` do."""
    admin = cloud.admin
    name, size = IMAGE
    admin.put(f"/images/{name}", json={"size_bytes": size}).raise_for_status()
    body = {"name": IMAGE_VM, "flavor": "small", "image": name, "network": "default"}
    created = admin.post("/vms", json={**body, "tags": ["gold"]})
    created.raise_for_status()
    uuid = created.json()["uuid"]
    began = time.monotonic()
    admin.post(f"/vms/{uuid}/start").raise_for_status()

    def vm() -> dict[str, Any]:
        answer = admin.get(f"/vms/{uuid}")
        answer.raise_for_status()
        found: dict[str, Any] = answer.json()
        return found

    wait_until(lambda: vm()["state"] == "running", 30)
    shown = vm()
    seconds = time.monotonic() - began
    sim = cloud.sims.get(shown["host"] or "")
    if sim is None:
        return ImageBoot(shown, seconds)
    return ImageBoot(shown, seconds, sim.disks().get(uuid), sim.nics().get(uuid, ()))


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# How the server answered a migration request, for people.
ANSWERS = {
    "began": "began a migration",
    "loadmaster.invalid_transition": "found the VM already moving",
    "loadmaster.no_valid_host": "found no host to take the VM",
}


def named(text: str, names: Mapping[str, str]) -> str:
    """``text`` with each VM uuid it holds replaced by that VM's name: the demo's reader
    knows the VMs by name (the server's messages name them by uuid)."""
    return _UUID.sub(lambda m: names.get(m.group(), m.group()), text)


def _counted(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items(), key=lambda c: -c[1]))


def refusals_line(acc: Account) -> str:
    """The refused launches and their retries, in words."""
    refused = len(acc.refusals)
    if not refused:
        return "no launch was refused"
    return (
        f"{refused} launches refused by their hosts, {acc.retries} of them placed again "
        f"on another host, {refused - acc.retries} not"
    )


def requests_line(requests: Mapping[str, int], acc: Account) -> str:
    """The SLA policies' migration requests by answer, and how the migrations they began
    ended (by the ledger): the parts add up to the whole."""
    asked = sum(requests.values())
    answers = {ANSWERS.get(code, f"refused ({code})"): n for code, n in requests.items()}
    moves = acc.outcomes("policy")
    return (
        f"{asked} migration requests from the hosts' SLA policies: {_counted(answers) or 'none'}; "
        f"{sum(moves.values())} migrations in the ledger: {_counted(moves) or 'none'}; "
        f"{moves.get('done', 0)} VMs moved"
    )


def _fullest(lm: Loadmaster, names: list[str]) -> str:
    counts = Counter(v.host for v in lm.vms.list(state="running"))
    return max(names, key=lambda n: (counts.get(n, 0), n))


def tier_guarantees() -> dict[str, float]:
    return {t.name: t.memory_guarantee for t in TIERS}
