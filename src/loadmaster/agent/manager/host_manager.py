"""The host's manager: registers the host, then carries out what the ledger puts on it.

As vdsm does for oVirt and nova-compute for Nova, the manager is the only component that
starts, stops and moves guests on its host. It reads the host's *work list* from the API
(long-polled: it returns as soon as the host's generation moves), and makes the
hypervisor match it:

- ``launch``: the host has the final say. If the VM cannot run here (not enough real free
  memory, a device the host does not have), it is refused with the reason and the API
  places it elsewhere. Otherwise it is started from its flavor, in a worker thread, and
  ``up`` is said as soon as it runs.
- ``run``: the VM's tags (its SLA tier) are kept in the domain metadata, where the SLA
  policy reads them.
- ``migrate_out``: the guest is moved to the destination's hypervisor, then ``up``
  completes the migration; a failure rolls back (the VM keeps running here). A
  destination this host cannot reach (libvirt's test driver private to another agent's
  process, or this host's own URI) is refused before anything moves. Its host devices
  are unplugged first and plugged back in if the move fails.
- ``migrate_in``: the source moves it; the devices its claim holds here are set aside
  (none free: refused before anything moves), and plugged in once it runs here, when
  ``up`` says them. If it already runs here (the source's agent died after the move),
  ``up`` completes it.
- A guest this manager launched that is on no item any more (stopped, deleted, moved
  away) is removed. Guests it did not launch are never touched.

Reports carry ``seen_generation`` (the generation of the last work list acted on before
the guests were listed) and the VMs still launching, so the ledger ends a claim only when
this agent knew of it and no longer runs it, whatever the clocks say.

This module makes the host's hypervisor match its work list.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from loadmaster.agent.hypervisor import DiskSpec, GuestSpec, Hypervisor, HypervisorError, NicSpec
from loadmaster.agent.hypervisor.base import HostInfo, unreachable_destination
from loadmaster.agent.hypervisor.devices import (
    Assignments,
    DeviceConfig,
    DeviceShortage,
    DeviceSource,
    Discovery,
    HostDevice,
    device_providers,
    parse_device_config,
    parse_node_devices,
    registration_children,
)
from loadmaster.errors import ValidationError
from loadmaster.quota import Quota

log = logging.getLogger(__name__)

STANDARD_DISCOVERED = ("VCPU", "MEMORY_MB")
KIB_PER_MB = 1024
# The long-poll of the work list: a change ends it at once, so this is how often an idle
# agent asks again, and an idle fleet costs its server in proportion (bench/fleet.py
# measures it; docs/architecture.md has the figures); hence 88-110 s, as Nomad's
# blocking queries wait minutes. A load balancer's idle timeout must exceed it.
DEFAULT_WAIT_S = 110.0
# An unchanged host still reports this often: the ledger has the last word restated even
# if a report was lost between a server and its database.
REPORT_AT_LEAST_EVERY_S = 600.0
MAX_BACKOFF_S = 10.0
# How often the host's devices are read again (Nova's resource tracker: every minute), so
# that one unplugged or changed is reported without waiting for the agent's restart.
DEVICE_RESCAN_S = 60.0


def matches_work_list(
    items: Iterable[Mapping[str, Any]], running: Set[str], launching: Set[str]
) -> bool:
    """Whether a host runs what its work list says, so that a report of it would have the
    ledger change nothing (``pending/reconcile.py``): every VM running is on the list,
    every ``run`` item runs, and every ``launch`` item is being launched and not yet
    running (running, it is to be activated). Moves in flight are their executors'."""
    actions = {str(item["vm"]).lower(): item["action"] for item in items}
    if not running <= actions.keys():
        return False
    return all(
        (action != "run" or vm in running)
        and (action != "launch" or (vm in launching and vm not in running))
        for vm, action in actions.items()
    )


def backoff(failures: int) -> float:
    """Seconds to wait after ``failures`` failed passes in a row: 0.5, 1, 2, ... up to
    ``MAX_BACKOFF_S``, each drawn at random from the upper half of its step."""
    step = min(MAX_BACKOFF_S, 0.25 * 2.0**failures)
    return step * random.uniform(0.5, 1.0)


class ManagerApi(Protocol):
    """The API calls a host manager makes (``runner.ApiClient`` over HTTP)."""

    def register(self, host: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def work(self, host: str, after: int, wait: float) -> dict[str, Any] | None:
        """None: the wait ended with generation ``after`` still current."""
        ...

    def up(self, vm: str, host: str, devices: list[dict[str, Any]] | None = None) -> None:
        """``host``: where the VM now runs; ``devices``: the host devices it was given."""
        ...

    def launch_failed(self, vm: str, host: str, reason: str) -> None: ...

    def migration_failed(self, vm: str, host: str, reason: str) -> None: ...

    def report(self, host: str, payload: dict[str, Any]) -> None: ...


# What a host keeps for itself unless its config says otherwise: memory for the kernel,
# the agent and the hypervisor's own processes (Nova's reserved_host_memory_mb default).
DEFAULT_RESERVED: Mapping[str, int] = MappingProxyType({"MEMORY_MB": 512})


@dataclass(frozen=True)
class ManagerConfig:
    """The design's "resource configuration on the compute node": what the host offers
    beyond what the hypervisor shows, what it keeps for itself and its overcommit.

    A TOML file::

        [host]
        name = "host-1"                  # default: the hypervisor's host name
        driver = "libvirt"               # an entry of loadmaster.hypervisors
        migration_uri = "qemu+tcp://host-1/system"  # how other hosts reach this hypervisor
        memory_headroom_mb = 512         # real free memory a launch must leave

        [reserved]                       # kept for the host itself
        MEMORY_MB = 2048                 # default 512 (DEFAULT_RESERVED); 0 keeps none
        VCPU = 1

        [allocation_ratio]
        VCPU = 4.0

        [resources]                      # custom classes, by amount
        DISK_GB = 500
        CUSTOM_LICENSE_X = 4

        [[pci.device_spec]]              # host devices offered (agent/hypervisor/devices.py)
        vendor_id = "8086"
        product_id = "10ed"
        address = "0000:3b:02.*"
        traits = ["HW_NIC_SRIOV", "physnet1"]

        [devices]
        enabled_mdev_types = ["nvidia-222"]
    """

    name: str | None = None
    driver: str | None = None
    migration_uri: str | None = None
    memory_headroom_mb: int = 0
    reserved: Mapping[str, int] = field(default_factory=dict)
    allocation_ratio: Mapping[str, float] = field(default_factory=dict)
    resources: Mapping[str, int] = field(default_factory=dict)
    launch_workers: int = 4
    devices: DeviceConfig = field(default_factory=DeviceConfig)

    @classmethod
    def from_file(cls, path: Path) -> ManagerConfig:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValidationError(f"{path}: {exc}", field="config") from exc
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "config") -> ManagerConfig:
        known = {"host", "reserved", "allocation_ratio", "resources", "pci", "devices"}
        for key in data:
            if key not in known:
                raise ValidationError(
                    f"{where}: [{key}] is not a section (known: {', '.join(sorted(known))})",
                    field=key,
                )
        host = _table(data, "host", where)
        for key in host:
            if key not in (
                "name",
                "driver",
                "migration_uri",
                "memory_headroom_mb",
                "launch_workers",
            ):
                raise ValidationError(f"{where}: host.{key} is not a setting", field=f"host.{key}")
        return cls(
            name=_opt_str(host, "name", where),
            driver=_opt_str(host, "driver", where),
            migration_uri=_opt_str(host, "migration_uri", where),
            memory_headroom_mb=_int(host.get("memory_headroom_mb", 0), "host.memory_headroom_mb"),
            launch_workers=max(1, _int(host.get("launch_workers", 4), "host.launch_workers")),
            reserved={
                k: _int(v, f"reserved.{k}") for k, v in _table(data, "reserved", where).items()
            },
            allocation_ratio={
                k: _ratio(v, f"allocation_ratio.{k}")
                for k, v in _table(data, "allocation_ratio", where).items()
            },
            resources={
                k: _int(v, f"resources.{k}") for k, v in _table(data, "resources", where).items()
            },
            devices=parse_device_config(
                _table(data, "pci", where), _table(data, "devices", where), where
            ),
        )


def discover(
    info: HostInfo, config: ManagerConfig, host_name: str, devices: Discovery | None = None
) -> dict[str, Any]:
    """The registration body: CPUs and memory from the hypervisor (on NUMA cells as child
    providers when there are several, as Placement models them), DISK_GB from its storage
    pool (or, for a shared pool, the pool's name and size: its sharing provider's), the
    configured classes on the root, reserved amounts (``DEFAULT_RESERVED``
    where the config names none) and ratios from the config, and the host's devices as
    child providers with their traits."""
    reserved = {**DEFAULT_RESERVED, **config.reserved}

    def inventory(name: str, total: int, reserved: int = 0) -> dict[str, Any]:
        return {
            "total": total,
            "reserved": min(reserved, total),
            "allocation_ratio": float(config.allocation_ratio.get(name, 1.0)),
        }

    root: dict[str, Any] = {
        name: inventory(name, amount, reserved.get(name, 0))
        for name, amount in sorted(config.resources.items())
    }
    children: dict[str, Any] = {}
    nodes: dict[int, str] = {}
    measured = {"VCPU": info.cpus, "MEMORY_MB": info.memory_kib // KIB_PER_MB}
    if len(info.numa_cells) > 1:
        # The host's own reservation comes out of the first cell, where the kernel lives.
        for i, cell in enumerate(info.numa_cells):
            cell_measured = {"VCPU": cell.cpus, "MEMORY_MB": cell.memory_kib // KIB_PER_MB}
            # Named under the host, as the control plane requires (hostcontrol._check_names).
            nodes[cell.id] = f"{host_name}_numa{cell.id}"
            children[nodes[cell.id]] = {
                name: inventory(name, total, reserved.get(name, 0) if i == 0 else 0)
                for name, total in cell_measured.items()
                if total > 0
            }
    else:
        for name, total in measured.items():
            root[name] = inventory(name, total, reserved.get(name, 0))
    if info.disk_gb and "DISK_GB" not in root:
        # The storage pool guests' disks are made in; a configured amount overrides it.
        root["DISK_GB"] = inventory("DISK_GB", info.disk_gb, reserved.get("DISK_GB", 0))
    body: dict[str, Any] = {"inventories": root, "children": children}
    if info.shared_pool is not None:
        pool = info.shared_pool
        # Its reservation and ratio are the operator's on the pool's provider.
        body["shared_pool"] = {
            "name": pool.name,
            "inventories": {"DISK_GB": {"total": pool.disk_gb}},
        }
    if devices is not None and devices.providers:
        device_children, body["child_traits"], parents = registration_children(devices, nodes)
        children.update(device_children)
        if parents:
            body["child_parents"] = parents
    return body


@dataclass
class StepReport:
    """What one pass over the work list did."""

    generation: int
    launched: list[str] = field(default_factory=list)
    # Launches and migrations the host refused.
    refused: list[str] = field(default_factory=list)
    migrating: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    retagged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class HostManager:
    def __init__(
        self,
        hypervisor: Hypervisor,
        api: ManagerApi,
        config: ManagerConfig,
        *,
        host_name: str | None = None,
        hypervisor_uri: str,
        device_source: DeviceSource | None = None,
    ) -> None:
        """``device_source``: where the host's devices (libvirt's node devices) and what
        its guests hold of them are read, at each registration when the config offers
        devices (``LibvirtDevices``)."""
        self.hypervisor = hypervisor
        self.device_source = device_source
        # Which guest holds which device: given at launch, freed once the VM left.
        self.assignments = Assignments()
        # The host's devices as last registered: their classes are the host's to offer.
        self.devices = Discovery()
        # VMs migrating here whose devices are set aside, to be plugged in on arrival.
        self._unplugged: set[str] = set()
        self._scanned_at = time.monotonic()
        self.api = api
        self.config = config
        self.hypervisor_uri = config.migration_uri or hypervisor_uri
        self.host_name = host_name or config.name or hypervisor.host_info().hostname
        # The generation of the last work list whose launches and moves are all under way:
        # what a report may claim to know.
        self.acted_generation = -1
        self._seen = -1
        # The items of the work list last acted on, for a wait that ends unchanged.
        self._items: list[Mapping[str, Any]] = []
        # What the last report said (or would have, when the host matched its list), and
        # when one was last sent: the period starts with the agent, so a host matching its
        # first list has nothing to restate yet.
        self._reported: tuple[frozenset[str], frozenset[str], int] | None = None
        self._reported_at = time.monotonic()
        self._lock = threading.Lock()
        self._launching: dict[str, Future[None]] = {}
        self._migrating: dict[str, Future[None]] = {}
        # Memory promised to launches under way, not yet visible in the host's free memory.
        self._launch_kib: dict[str, int] = {}
        # For the log: the names of the VMs on the last work list, and those on their way
        # here, whose arrival is logged when the ledger says they run here.
        self._names: dict[str, str] = {}
        self._arriving: set[str] = set()
        self._pool = ThreadPoolExecutor(
            max_workers=config.launch_workers, thread_name_prefix=f"lm-{self.host_name}"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- registration ----------------------------------------------------------------------
    def discover_devices(self) -> Discovery:
        """The host's devices as the config's device spec offers them; a spec that matches
        nothing is logged, naming it."""
        if self.config.devices.empty:
            return Discovery()
        if self.device_source is None:
            raise ValidationError(
                f"host {self.host_name}: the config offers devices ([pci] device_spec or "
                "[devices] enabled_mdev_types) but the hypervisor lists none",
                field="pci.device_spec",
            )
        found = device_providers(
            self.host_name,
            parse_node_devices(self.device_source.node_device_xmls()),
            self.config.devices,
        )
        for spec in found.unmatched:
            log.warning("%s matches no device of host %s", spec, self.host_name)
        return found

    def rescan_devices(self) -> bool:
        """Read the host's devices again and register the host anew if they changed (a
        device gone is withdrawn by the server; what VMs hold of it stays). Returns
        whether they changed."""
        self._scanned_at = time.monotonic()
        found = self.discover_devices()
        if found.providers == self.devices.providers:
            return False
        log.warning("the devices of host %s changed: registering them again", self.host_name)
        self.register()
        return True

    def register(self) -> dict[str, Any]:
        self._scanned_at = time.monotonic()
        self.devices = self.discover_devices()
        if self.devices.providers and self.device_source is not None:
            self.assignments.restore(self.device_source.guest_xmls(), self.devices)
        body = discover(self.hypervisor.host_info(), self.config, self.host_name, self.devices)
        body["hypervisor_uri"] = self.hypervisor_uri
        answer = self.api.register(self.host_name, body)
        # The devices are children too, not cells.
        nodes = len(set(body["children"]) - {p.name for p in self.devices.providers})
        cells = f" on {nodes} NUMA cells" if nodes else ""
        log.info(
            "host %s registered (%s): %s%s",
            self.host_name,
            self.hypervisor_uri,
            _amounts(body["inventories"], *body["children"].values()),
            cells,
        )
        for where, why in dict(answer.get("refused") or {}).items():
            log.warning("inventory %s not changed: %s", where, why)
        for child in answer.get("withdrawn") or ():
            log.warning("provider %s is no longer discovered: its inventory is withdrawn", child)
        return answer

    # -- the loop --------------------------------------------------------------------------
    def run_forever(self, stop: threading.Event, *, wait: float = DEFAULT_WAIT_S) -> None:
        """Act on the work list whenever it changes, until ``stop``; ``register`` first.

        Each long-poll waits a random 80-100 % of ``wait``, and a failed pass is tried
        again after a delay that doubles up to ``MAX_BACKOFF_S``, drawn at random from its
        upper half: agents started together, or cut off together by a server restart, do
        not keep arriving together."""
        failures = 0
        while not stop.is_set():
            try:
                self.step(wait=wait * random.uniform(0.8, 1.0))
                self.report()
                if time.monotonic() - self._scanned_at >= DEVICE_RESCAN_S:
                    self.rescan_devices()
                failures = 0
            except Exception as exc:  # the API or the hypervisor away: try again shortly
                if stop.is_set():
                    return  # cut off by the agent's shutdown, not a failure
                failures += 1
                delay = backoff(failures)
                log.warning("host manager step failed (again in %.1f s): %s", delay, exc)
                stop.wait(delay)

    def step(self, *, wait: float = 0.0) -> StepReport:
        """Read the work list (waiting up to ``wait`` s for a change) and act on it."""
        work = self.api.work(self.host_name, self._seen, wait)
        if work is None:
            # Nothing changed since the list last acted on: that one again, so a guest that
            # vanished meanwhile is still noticed.
            work = {"generation": self._seen, "items": self._items}
        generation = int(work["generation"])
        report = StepReport(generation)
        guests = {g.uuid: g for g in self.hypervisor.list_guests()}
        self._names = {str(i["vm"]).lower(): str(i["name"]) for i in work["items"] if i.get("name")}
        self._log_arrivals(work["items"], guests.keys())
        wanted: set[str] = set()
        # Launches and arrivals whose devices a guest leaving in this pass still holds.
        deferred: list[Mapping[str, Any]] = []
        for item in work["items"]:
            vm = str(item["vm"]).lower()
            wanted.add(vm)
            action = item["action"]
            try:
                if action == "launch":
                    self._launch(item, vm, vm in guests, report, deferred)
                elif action == "run":
                    self._retag(item, vm, guests, report)
                elif action == "migrate_out":
                    self._migrate_out(item, vm, vm in guests, report)
                elif action == "migrate_in":
                    self._migrate_in(item, vm, vm in guests, report, deferred)
            except Exception as exc:  # one VM's trouble must not stop the others
                _log_failure(f"{action} of {self._vm(vm)}", exc)
                report.errors.append(f"{vm}: {action}: {exc}")
        with self._lock:
            busy = set(self._launching) | set(self._migrating)
        doomed = [u for u, g in guests.items() if g.managed and u not in wanted | busy]
        try:
            # A definition a killed agent left half done (a launch defined but not started,
            # a move stopped here but not undefined) whose VM is no longer on this host.
            doomed += [u for u in self.hypervisor.stopped_guests() if u not in wanted | busy]
        except Exception as exc:
            report.errors.append(f"stopped guests: {exc}")
        # A host that is down (fenced, back after it died) had its VMs evacuated: on a
        # shared pool they run on from their disks elsewhere, which stay.
        evacuated = False
        if doomed:
            # The work list was read before the guests were listed: a guest that arrived in
            # between (a migration claimed and carried out meanwhile) is not on it. Only
            # what a list read after the listing still leaves out is removed.
            fresh = self.api.work(self.host_name, -1, 0) or {"items": ()}
            still = {str(i["vm"]).lower() for i in fresh["items"]}
            doomed = [u for u in doomed if u not in still]
            evacuated = fresh.get("state") == "down"
        for uuid in doomed:
            try:
                self.hypervisor.remove_guest(uuid, keep_disk=evacuated)
                report.removed.append(uuid)
                name = guests[uuid].name if uuid in guests else None
                log.info(
                    "stopped and removed VM %s: no longer on this host's work list (stopped, "
                    "deleted or moved away)",
                    f"{name} ({uuid})" if name else uuid,
                )
            except Exception as exc:
                report.errors.append(f"{uuid}: remove: {exc}")
        # Devices of VMs no longer here (stopped, removed, moved away, given up) are free;
        # a guest that could not be removed keeps its own.
        with self._lock:
            busy = set(self._launching) | set(self._migrating)
        self.assignments.keep_only(wanted | busy | {u for u in doomed if u not in report.removed})
        self._unplugged &= set(self.assignments.held())
        for item in deferred:
            vm = str(item["vm"]).lower()
            try:
                if item["action"] == "launch":
                    self._launch(item, vm, False, report)
                else:
                    self._migrate_in(item, vm, False, report)
            except Exception as exc:
                _log_failure(f"{item['action']} of {vm}", exc)
                report.errors.append(f"{vm}: {item['action']}: {exc}")
        # Only now is this work list seen: a pass that failed half way (the hypervisor
        # away) is read and carried out again at once, not after the next change.
        self._seen = self.acted_generation = generation
        self._items = list(work["items"])
        return report

    def report_context(self) -> dict[str, Any]:
        """Taken just before the guests are listed for a report: what the agent knew then."""
        with self._lock:
            launching = sorted(self._launching)
        # Before its first pass the agent knows of no claim: generation 0 says so, where
        # leaving it out would have the report judged by the clock.
        return {"launching": launching, "seen_generation": max(0, self.acted_generation)}

    def report(self) -> bool:
        """Report the host's VMs if they, the launches under way or the generation seen
        differ from the last report sent, and the host is not what its work list says
        (or the last report is ``REPORT_AT_LEAST_EVERY_S`` old). Liveness is the
        long-poll's, and a host that matches its list would have the ledger change
        nothing, so an unchanged host sends nothing, and neither does one whose VMs
        changed only as the ledger already knows (a launch begun, a VM said up).
        Returns whether a report went out."""
        context = self.report_context()
        running = [g.uuid for g in self.hypervisor.list_guests()]
        with self._lock:
            # A launch that finished between the two reads is running or still listed.
            context["launching"] = sorted(set(context["launching"]) | set(self._launching))
        said = (frozenset(running), frozenset(context["launching"]), context["seen_generation"])
        fresh = time.monotonic() - self._reported_at < REPORT_AT_LEAST_EVERY_S
        if fresh and (said == self._reported or matches_work_list(self._items, *said[:2])):
            self._reported = said
            return False
        self.api.report(self.host_name, {"running_vms": running, **context})
        self._reported, self._reported_at = said, time.monotonic()
        return True

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait for every launch and migration under way (tests, shutdown)."""
        with self._lock:
            futures = [*self._launching.values(), *self._migrating.values()]
        for future in futures:
            try:
                future.result(timeout=timeout)
            except Exception:  # already logged and reported by the worker
                continue
        return True

    # -- actions ---------------------------------------------------------------------------
    def _launch(
        self,
        item: Mapping[str, Any],
        vm: str,
        running: bool,
        report: StepReport,
        deferred: list[Mapping[str, Any]] | None = None,
    ) -> None:
        """``deferred``: where a launch goes whose devices are short now, to be tried once
        more after the pass has removed the guests that left (and freed theirs)."""
        if running:
            # Started before a restart, or by the last pass; or it arrived by a migration
            # whose source died (its claim here became a launch).
            self._say_up(item, vm, report)
            return
        with self._lock:
            if vm in self._launching:
                return
        refusal = self._refusal(item)
        if refusal is not None:
            log.info("refused to launch %s, the API places it elsewhere: %s", self._vm(vm), refusal)
            self.api.launch_failed(vm, self.host_name, refusal)
            report.refused.append(vm)
            return
        try:
            given = self.assignments.assign(
                vm, item.get("providers") or {}, self.devices, direct_macs(item)
            )
        except DeviceShortage as exc:
            if deferred is not None:
                deferred.append(item)
                return
            reason = f"host {self.host_name}: {exc}"
            log.info("refusing %s: %s", vm, reason)
            self.api.launch_failed(vm, self.host_name, reason)
            report.refused.append(vm)
            return
        spec = replace(guest_spec(item), host_devices=given)
        with self._lock:
            self._launch_kib[vm] = spec.memory_kib
            self._launching[vm] = self._pool.submit(self._run_launch, spec)
        report.launched.append(vm)

    def _refusal(self, item: Mapping[str, Any]) -> str | None:
        """The host's final say: why this VM cannot run here, or None."""
        offered = set(self.config.resources) | set(STANDARD_DISCOVERED) | {"DISK_GB"}
        offered |= {p.resource_class for p in self.devices.providers}
        missing = sorted(set(item.get("resources") or {}) - offered)
        if missing:
            return f"host {self.host_name} has no {', '.join(missing)} (not in its agent config)"
        need_kib = int(item["memory_mb"]) * KIB_PER_MB
        info = self.hypervisor.host_info()
        with self._lock:
            promised = sum(self._launch_kib.values())
        free = info.free_memory_kib - promised - self.config.memory_headroom_mb * KIB_PER_MB
        if need_kib > free:
            return (
                f"host {self.host_name} has {max(0, free) // KIB_PER_MB} MiB of real memory free "
                f"(after {self.config.memory_headroom_mb} MiB headroom and launches under way), "
                f"the VM needs {need_kib // KIB_PER_MB} MiB"
            )
        return None

    def _run_launch(self, spec: GuestSpec) -> None:
        started = time.monotonic()
        what = f"VM {spec.name} ({spec.uuid})"
        try:
            self.hypervisor.launch_guest(spec)
        except Exception as exc:
            log.warning("launch of %s failed, the API places it elsewhere: %s", what, exc)
            self.assignments.release(spec.uuid)
            reason = f"launch failed: {exc}"
            self._finish(self._launching, spec.uuid, self.api.launch_failed, self.host_name, reason)
            return
        log.info(
            "launched %s: %d vCPUs, %d MiB, in %.1f s",
            what,
            spec.vcpus,
            spec.memory_kib // KIB_PER_MB,
            time.monotonic() - started,
        )
        if not spec.host_devices:
            self._finish(self._launching, spec.uuid, self.api.up, self.host_name)
            return
        given = said_devices(spec.host_devices)
        self._finish(
            self._launching,
            spec.uuid,
            lambda vm, host: self.api.up(vm, host, devices=given),
            self.host_name,
        )

    def _retag(
        self, item: Mapping[str, Any], vm: str, guests: Mapping[str, Any], report: StepReport
    ) -> None:
        guest = guests.get(vm)
        if guest is not None and self._needs_devices(item, vm):
            self._say_up(item, vm, report)  # arrived: its devices here go in now
        tags = frozenset(item.get("tags") or ())
        if guest is not None and guest.managed and guest.tags != tags:
            self.hypervisor.set_tags(vm, tags)
            report.retagged.append(vm)

    def _migrate_out(
        self, item: Mapping[str, Any], vm: str, here: bool, report: StepReport
    ) -> None:
        with self._lock:
            if vm in self._migrating:
                return
        if not here:
            return  # moved already (an earlier run of this agent): the destination says up
        target_uri = item.get("target_uri")
        if not target_uri:
            log.warning(
                "cannot migrate %s: destination %s has no agent",
                self._vm(vm),
                item.get("target_host"),
            )
            self.api.migration_failed(
                vm, self.host_name, f"destination {item.get('target_host')} has no agent"
            )
            return
        target_host = str(item.get("target_host"))
        why = unreachable_destination(str(target_uri), self.hypervisor_uri)
        if why is not None:
            why = f"destination {target_host} cannot be reached: {why}"
            # Refused before anything moves: the guest keeps running here and the
            # destination's claim goes.
            log.warning("not migrating %s: %s", self._vm(vm), why)
            self.api.migration_failed(vm, self.host_name, why)
            report.refused.append(vm)
            return
        with self._lock:
            self._migrating[vm] = self._pool.submit(
                self._run_migration, vm, str(target_uri), target_host
            )
        report.migrating.append(vm)
        log.info("migrating %s to host %s (%s)", self._vm(vm), item.get("target_host"), target_uri)

    def _migrate_in(
        self,
        item: Mapping[str, Any],
        vm: str,
        here: bool,
        report: StepReport,
        deferred: list[Mapping[str, Any]] | None = None,
    ) -> None:
        """The destination's side: the devices its claim holds here are set aside for it
        (none to spare refuses the move before anything moves), and plugged in when it
        has arrived. ``deferred`` as for a launch."""
        if here:
            self._say_up(item, vm, report)  # the source moved it and died before saying so
            return
        if vm in self.assignments.held() or not item.get("providers"):
            return
        try:
            if self.assignments.assign(vm, item["providers"], self.devices, direct_macs(item)):
                self._unplugged.add(vm)
        except DeviceShortage as exc:
            if deferred is not None:
                deferred.append(item)
                return
            reason = f"host {self.host_name}: {exc}"
            log.warning("refusing the migration of %s here: %s", self._vm(vm), reason)
            self.api.migration_failed(vm, self.host_name, reason)
            report.refused.append(vm)

    def _run_migration(self, vm: str, target_uri: str, target_host: str) -> None:
        started = time.monotonic()
        held = self.assignments.held().get(vm, ())
        try:
            if held:
                # A guest holding VFIO devices cannot move: they are unplugged, and the
                # destination plugs in its own.
                self.hypervisor.set_host_devices(vm, ())
            self.hypervisor.migrate_guest(vm, target_uri)
        except Exception as exc:
            if held:
                self._plug_back(vm, held)
            log.warning(
                "migration of %s to host %s (%s) failed, it keeps running here: %s",
                self._vm(vm),
                target_host,
                target_uri,
                exc,
            )
            reason = f"migration to {target_uri} failed: {exc}"
            self._finish(self._migrating, vm, self.api.migration_failed, self.host_name, reason)
            return
        log.info(
            "migrated %s to host %s in %.1f s",
            self._vm(vm),
            target_host,
            time.monotonic() - started,
        )
        self._finish(self._migrating, vm, self.api.up, target_host)

    def _finish(
        self,
        under_way: dict[str, Future[None]],
        vm: str,
        say: Callable[..., None],
        *args: str,
    ) -> None:
        """Tell the API ``say(vm, *args)``. The VM stays under way until the API has heard
        the outcome, so no report in between can take it for gone."""
        try:
            say(vm, *args)
        except Exception as exc:
            _log_failure(f"telling the API about {self._vm(vm)}", exc)
        finally:
            with self._lock:
                under_way.pop(vm, None)
                self._launch_kib.pop(vm, None)

    def _plug_back(self, vm: str, held: Sequence[HostDevice]) -> None:
        try:
            self.hypervisor.set_host_devices(vm, held)
        except Exception as exc:
            log.warning("%s runs here without its host devices: %s", self._vm(vm), exc)

    def _needs_devices(self, item: Mapping[str, Any], vm: str) -> bool:
        """Whether ``vm``, running here, still waits for devices its claim holds here: it
        arrived by a migration, which it made without any."""
        if vm in self._unplugged:
            return True
        if vm in self.assignments.held():
            return False
        offered = {p.name for p in self.devices.providers}
        return any(p in offered for p in item.get("providers") or ())

    def _say_up(self, item: Mapping[str, Any], vm: str, report: StepReport) -> None:
        """``vm`` runs here: said with the devices it was given here, plugged in first
        when it arrived without them."""
        if not self._needs_devices(item, vm):
            self.api.up(vm, self.host_name)
            report.completed.append(vm)
            return
        try:
            given = self.assignments.assign(vm, item["providers"], self.devices, direct_macs(item))
        except DeviceShortage as exc:
            # It moved already: it runs without them until some are free.
            raise HypervisorError(f"{self._vm(vm)} arrived, but {exc}") from exc
        if not given:
            self.api.up(vm, self.host_name)
            report.completed.append(vm)
            return
        self.hypervisor.set_host_devices(vm, given)
        self._unplugged.discard(vm)
        log.info("%s arrived: plugged in %s", self._vm(vm), ", ".join(d.address for d in given))
        self.api.up(vm, self.host_name, devices=said_devices(given))
        report.completed.append(vm)

    def _vm(self, vm: str) -> str:
        """A VM as the log names it: its name, then its uuid."""
        name = self._names.get(vm)
        return f"VM {name} ({vm})" if name else f"VM {vm}"

    def _log_arrivals(self, items: Iterable[Mapping[str, Any]], here: Set[str]) -> None:
        """A migration in is carried out by the source's agent: this host sees it begin
        (a ``migrate_in`` item) and end (the VM runs here, a ``run`` item). A move quicker
        than this host's look at its list shows only its end: a VM running here that the
        last list did not hold."""
        actions = {str(i["vm"]).lower(): i["action"] for i in items}
        before = {str(i["vm"]).lower() for i in self._items} if self._seen >= 0 else None
        for vm, action in actions.items():
            if action == "migrate_in" and vm not in self._arriving:
                self._arriving.add(vm)
                log.info("%s is migrating here; its source host's agent moves it", self._vm(vm))
            elif (
                action == "run"
                and vm in here
                and (vm in self._arriving or (before is not None and vm not in before))
            ):
                log.info("%s migrated in: it runs here", self._vm(vm))
        # Arrived, or given up (aborted, failed at its source): no longer expected.
        self._arriving = {vm for vm in self._arriving if actions.get(vm) == "migrate_in"}


def _amounts(*inventories: Mapping[str, Mapping[str, Any]]) -> str:
    """``VCPU=8, MEMORY_MB=7680``: each class's total over the given providers."""
    totals: dict[str, int] = {}
    for inventory in inventories:
        for name, inv in inventory.items():
            totals[name] = totals.get(name, 0) + int(inv["total"])
    return ", ".join(f"{name}={total}" for name, total in sorted(totals.items())) or "nothing"


def guest_spec(item: Mapping[str, Any]) -> GuestSpec:
    """What to launch for a work item: its size, tags, disk, NICs and quota."""
    disk = item.get("disk")
    return GuestSpec(
        uuid=str(item["vm"]).lower(),
        name=str(item["name"]),
        memory_kib=int(item["memory_mb"]) * KIB_PER_MB,
        vcpus=max(1, int(item["vcpus"])),
        tags=frozenset(item.get("tags") or ()),
        disk=DiskSpec(disk.get("image"), int(disk["size_bytes"])) if disk else None,
        nics=tuple(
            NicSpec(str(n["network"]), str(n["mac"]))
            for n in item.get("nics") or ()
            if n.get("vnic_type") != "direct"
        ),
        quota=Quota.from_dict(item.get("quota")),
    )


def direct_macs(item: Mapping[str, Any]) -> list[str]:
    """The MACs of the work item's NICs that are VFs of the VM's (``vnic_type`` direct):
    each is written as its VF's ``<interface type='hostdev'>``, not on a host network."""
    return [str(n["mac"]) for n in item.get("nics") or () if n.get("vnic_type") == "direct"]


def said_devices(given: Iterable[HostDevice]) -> list[dict[str, Any]]:
    """Devices given to a VM as its up says them to the API."""
    return [{"provider": d.provider, "address": d.address, "mdev_uuid": d.mdev_uuid} for d in given]


def _log_failure(what: str, exc: Exception) -> None:
    # 403/409: the VM's claim moved on meanwhile (stopped, re-placed, or the other side of
    # a migration said it first); the next pass acts on what is true then. Not a warning.
    level = logging.INFO if getattr(exc, "status", None) in (403, 409) else logging.WARNING
    log.log(level, "%s failed: %s", what, exc)


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ValidationError(f"{where}: [{key}] must be a table", field=key)
    return value


def _opt_str(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValidationError(
            f"{where}: host.{key} must be a non-empty string", field=f"host.{key}"
        )
    return value


def _int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(f"{name} must be an integer of at least 0, got {value!r}", field=name)
    return value


def _ratio(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1e6:
        raise ValidationError(f"{name} must be a number above 0, got {value!r}", field=name)
    return float(value)
