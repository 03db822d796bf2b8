"""The control plane's side of host agents: registration, the work list, launch outcomes.

An agent is the host's manager (as vdsm is for oVirt, nova-compute for Nova). It registers
its host with the inventory it discovered, reads the host's *work list* (every VM the
ledger puts on the host, with what to do about it), carries it out on its hypervisor and
says how it went: ``up`` when a VM runs, ``fail`` when the host refuses or cannot launch
a VM or a migration failed. A refused launch is placed again elsewhere, excluding every
host that refused it, up to ``max_launch_attempts`` hosts (Nova's alternates).

This module is the control plane's half of the host-agent protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from loadmaster.cluster import HostRecord, HostService, ResourceClassService, TraitService, lookup
from loadmaster.cluster.host_rows import parse_inventories
from loadmaster.cluster.liveness import DEFAULT_SILENT_AFTER_S, agent_live, epoch
from loadmaster.cluster.records import VmRecord
from loadmaster.cluster.vms import vm_records
from loadmaster.errors import ConcurrentUpdate, Conflict, NotFound, ValidationError
from loadmaster.heartbeat import DEFAULT_HEARD_EVERY_S
from loadmaster.hostcontrol.pools import PoolMembership, check_pool
from loadmaster.hostcontrol.watch import HostWatch, WatchedHost
from loadmaster.hostcontrol.worklists import WorkList, read_work_lists
from loadmaster.pending import Ledger, ReconcileResult, check_as_of
from loadmaster.resources import (
    STANDARD_TRAITS,
    Inventory,
    validate_custom_trait,
    validate_trait_name,
)
from loadmaster.scheduler import Placement, RequestSpec, Scheduler, check_measures
from loadmaster.store import Store
from loadmaster.store.locking import iso_utc, mark_changed, now
from loadmaster.store.schema import (
    HostAgentRow,
)

DEFAULT_MAX_LAUNCH_ATTEMPTS = 3
# Between a host's name and its child's own part: HOST_numa0.
CHILD_SEPARATOR = "_"
# What each VM on the host's work list asks of its agent.
ACTIONS = ("launch", "run", "migrate_out", "migrate_in")


@dataclass(frozen=True)
class Registration:
    host: HostRecord
    # Inventories the agent discovered but could not write, and why (a shrink below what
    # is allocated is reported, never forced).
    refused: Mapping[str, str] = field(default_factory=dict)
    # The host's child providers the agent no longer discovered (a device gone): their
    # inventory is withdrawn, but what is allocated of it stays until its VMs leave.
    withdrawn: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentStatus:
    """``status``: ``none`` (no agent registered), ``ok``, or ``silent`` (not heard from for
    longer than the configured time; its claims stay, an operator must look)."""

    host: str
    status: str
    hypervisor_uri: str | None = None
    last_seen_at: datetime | None = None
    # Fences of the host's current silence that failed in a row, and the last one's error.
    fence_failures: int = 0
    fence_error: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "hypervisor_uri": self.hypervisor_uri,
            "last_seen_at": iso_utc(self.last_seen_at) if self.last_seen_at else None,
            "fence_failures": self.fence_failures,
            "fence_error": self.fence_error,
        }


@dataclass(frozen=True)
class _Said:
    """What a report says about the host's VMs, compared between reports."""

    running: frozenset[str]
    launching: frozenset[str]
    seen_generation: int | None

    @classmethod
    def of(cls, running: Sequence[str], launching: Sequence[str], seen: int | None) -> _Said:
        return cls(
            frozenset(lookup.canonical_uuid(v) for v in running),
            frozenset(lookup.canonical_uuid(v) for v in launching),
            seen,
        )


@dataclass(frozen=True)
class LaunchFailure:
    """After a host gave a VM up: where it was placed again, or why it stays requested."""

    vm: VmRecord
    kind: str | None
    placement: Placement | None = None


class HostControl:
    def __init__(
        self,
        store: Store,
        hosts: HostService,
        classes: ResourceClassService,
        ledger: Ledger,
        scheduler: Scheduler,
        *,
        max_launch_attempts: int = DEFAULT_MAX_LAUNCH_ATTEMPTS,
        silent_after_s: float = DEFAULT_SILENT_AFTER_S,
        heard_every_s: float = DEFAULT_HEARD_EVERY_S,
    ) -> None:
        self._store = store
        self._hosts = hosts
        self._classes = classes
        self._traits = TraitService(store)
        self._pools = PoolMembership(store, hosts)
        self._ledger = ledger
        self._scheduler = scheduler
        self.max_launch_attempts = max_launch_attempts
        self.silent_after = timedelta(seconds=silent_after_s)
        # How often a server records a live agent (``agent_heard_every``): its watcher's
        # refresh, and what evacuation's fleet rule allows for.
        self.heard_every = heard_every_s
        # A server process sets its watcher here: liveness is then written in bulk, and
        # host generations come from its cache.
        self.watch: HostWatch | None = None
        # Per host: what the last report this process reconciled said, and the host's
        # generation after it (see ``report``).
        self._reconciled: dict[str, tuple[_Said, tuple[int, int]]] = {}

    # -- registration ----------------------------------------------------------------------
    def register(
        self,
        name: str,
        *,
        hypervisor_uri: str,
        inventories: Mapping[str, Mapping[str, object]],
        children: Mapping[str, Mapping[str, Mapping[str, object]]] | None = None,
        child_traits: Mapping[str, Sequence[str]] | None = None,
        child_parents: Mapping[str, str] | None = None,
        shared_pool: Mapping[str, object] | None = None,
        run: str | None = None,
    ) -> Registration:
        """Create the host (and its child providers, e.g. NUMA cells and devices) or find
        it by name, then make its inventories (and its children's traits, for those
        ``child_traits`` names) what the agent discovered; a child ``child_parents`` names
        goes under that other child (a device under its NUMA node). Each write is a compare-and-
        swap on the provider's generation, retried on a race; a change that would put a
        class below what is allocated is refused and reported, and the rest still lands.
        A child named after the host (``<host>_...``) that the agent no longer lists has
        its inventory withdrawn the same way (``withdrawn``). ``shared_pool`` (name,
        inventories): the storage pool the host mounts with others, one sharing provider
        in an aggregate with them (``hostcontrol/pools.py``); without it the host leaves
        the pools it was in. ``run``: the run of the
        agent registering (``heartbeat.AGENT_RUN_HEADER``), which holds no work list yet:
        the host takes VMs once that run has read one."""
        if not isinstance(hypervisor_uri, str) or not hypervisor_uri or len(hypervisor_uri) > 1024:
            raise ValidationError(
                "hypervisor_uri must be a libvirt URI of at most 1024 characters",
                field="hypervisor_uri",
            )
        # Everything is checked before anything is written: bad input changes nothing.
        wanted = parse_inventories(inventories)
        parsed_children = {
            child: parse_inventories(inv, f"children.{child}")
            for child, inv in sorted((children or {}).items())
        }
        self._check_names(name, parsed_children)
        pool = check_pool(self._hosts, name, shared_pool)
        traits = self._check_child_traits(child_traits or {}, parsed_children)
        parents = dict(child_parents or {})
        for child, parent in sorted(parents.items()):
            where = f"child_parents.{child}"
            if child not in parsed_children:
                raise ValidationError(
                    f"{where}: {child} is not among the registration's children", field=where
                )
            if parent not in parsed_children or parent in parents:
                raise ValidationError(
                    f"{where}: the parent {parent} must be another child of the registration, "
                    "one directly under the host",
                    field=where,
                )
        self._ensure_custom_classes([wanted, *parsed_children.values()])
        for trait in sorted({t for names in traits.values() for t in names}):
            if trait not in STANDARD_TRAITS:
                self._traits.create(trait)
        refused: dict[str, str] = {}
        root = self._ensure(name, None, wanted, refused)
        uuids = {name: root.uuid}
        # The host's own children first, then those under them.
        for child, child_inventories in sorted(
            parsed_children.items(), key=lambda kv: (kv[0] in parents, kv[0])
        ):
            made = self._ensure(child, uuids[parents.get(child, name)], child_inventories, refused)
            uuids[child] = made.uuid
            if child in traits:
                self._hosts.set_traits(child, traits[child])
        withdrawn = []
        for known in self._hosts.list(in_tree=root.uuid):
            if (
                known.uuid != root.uuid
                and known.name not in parsed_children
                and known.name.startswith(name + CHILD_SEPARATOR)
                and known.inventories
            ):
                self._ensure(known.name, known.parent, {}, refused)
                withdrawn.append(known.name)
        self._pools.join(
            name, pool, lambda provider, inv: self._ensure(provider, None, inv, refused)
        )
        with self._store.write() as session:
            row = lookup.host_row(session, name)
            agent = session.get(HostAgentRow, row.id)
            stamp = now()
            if agent is None:
                session.add(
                    HostAgentRow(
                        host_id=row.id,
                        hypervisor_uri=hypervisor_uri,
                        registered_at=stamp,
                        last_seen_at=stamp,
                        seen_generation=0,
                        agent_run=run,
                    )
                )
                # A host that can act now: schedulers' snapshots read their agents again
                # (they read the changed ones only once a second), so the host is
                # chosen from the next placement on, not a second later.
                mark_changed(session, [row.id], layout=True)
            else:
                agent.hypervisor_uri = hypervisor_uri
                agent.last_seen_at = stamp
                if run is not None:
                    agent.agent_run = run
        if run is not None:
            self._scheduler.agents_changed()
        return Registration(self._hosts.get(name), refused, tuple(withdrawn))

    @staticmethod
    def _check_child_traits(
        child_traits: Mapping[str, Sequence[str]], children: Mapping[str, object]
    ) -> dict[str, list[str]]:
        """Traits for children the registration lists, each a standard trait or a custom
        one (created with the child, as custom classes are)."""
        out = {}
        for child, names in sorted(child_traits.items()):
            where = f"child_traits.{child}"
            if child not in children:
                raise ValidationError(
                    f"{where}: {child} is not among the registration's children", field=where
                )
            checked = [validate_trait_name(t, f"{where}[{i}]") for i, t in enumerate(names)]
            for i, trait in enumerate(checked):
                if trait not in STANDARD_TRAITS:
                    validate_custom_trait(trait, f"{where}[{i}]")
            out[child] = sorted(set(checked))
        return out

    def _check_names(self, name: str, children: Iterable[str]) -> None:
        """The host must be a root provider, and each child its own: one already under the
        host, or a new one named ``<host>_<suffix>`` (``node-3_numa0``, as Nova names a
        compute node's children ``<node>_<device>``). A host's DNS name never holds an
        underscore, so an agent cannot take a name a future host would use."""
        root = self._find(name)
        if root is not None and root.parent is not None:
            raise Conflict(
                f"{name} is a child provider, not a host; an agent registers a root host",
                field="name",
            )
        for child in children:
            where = f"children.{child}"
            found = self._find(child)
            if found is None:
                if not child.startswith(name + CHILD_SEPARATOR) or child == name + CHILD_SEPARATOR:
                    raise ValidationError(
                        f"{where}: a new child provider is named after its host: "
                        f"{name}{CHILD_SEPARATOR}<suffix>, e.g. {name}{CHILD_SEPARATOR}numa0",
                        field=where,
                    )
            elif root is None or found.root != root.uuid:
                owner = "a root host" if found.parent is None else "a child of another host"
                raise Conflict(
                    f"{where}: provider {child} exists as {owner}; a host's child providers "
                    "must have names of their own",
                    field=where,
                )

    def _find(self, name: str) -> HostRecord | None:
        try:
            return self._hosts.get(name)
        except NotFound:
            return None

    def _ensure_custom_classes(self, inventories: Sequence[Mapping[str, Inventory]]) -> None:
        """Custom classes the host's config names come into being with it, as Nova's compute
        creates them in Placement; a standard class unknown here is an error."""
        for name in sorted({n for inv in inventories for n in inv}):
            if not name.startswith("CUSTOM_"):
                continue
            try:
                self._classes.get(name)
            except NotFound:
                # Another agent may create it meanwhile, maybe with another description.
                with contextlib.suppress(Conflict):
                    self._classes.create(name, description="announced by a host agent")

    def _ensure(
        self,
        name: str,
        parent: str | None,
        inventories: Mapping[str, Inventory],
        refused: dict[str, str],
    ) -> HostRecord:
        try:
            record = self._hosts.get(name)
        except NotFound:
            try:
                return self._hosts.create(
                    name,
                    parent=parent,
                    inventories={k: v.as_dict() for k, v in inventories.items()},
                )
            except Conflict:
                record = self._hosts.get(name)  # another registration won the race
        if record.parent != parent:
            raise Conflict(
                f"provider {name} exists under another parent ({record.parent or 'none'}); "
                "a host's child providers must have names of their own",
                field="name",
            )
        for _ in range(5):
            try:
                return self._hosts.set_inventories(
                    name,
                    self._keep_in_use(name, inventories, refused),
                    generation=record.generation,
                )
            except ConcurrentUpdate:
                record = self._hosts.get(name)
        raise ConcurrentUpdate(f"host {name} kept changing; register again", field="generation")

    def _keep_in_use(
        self, name: str, wanted: Mapping[str, Inventory], refused: dict[str, str]
    ) -> dict[str, Mapping[str, object]]:
        """``wanted``, except that a class whose new capacity would be below its allocations
        keeps its current inventory (the host has the final say on what may start there,
        not on what already holds resources)."""
        result: dict[str, Mapping[str, object]] = {k: v.as_dict() for k, v in wanted.items()}
        current = self._hosts.get(name).inventories
        for class_name, usage in self._hosts.usage(name).items():
            new = wanted.get(class_name)
            capacity = new.capacity if new is not None else 0
            if usage.used and capacity < usage.used:
                refused[f"{name}.{class_name}"] = (
                    f"discovered capacity {capacity} is below the {usage.used} allocated; "
                    "the inventory is kept until VMs leave"
                )
                result[class_name] = current[class_name].as_dict()
        return result

    # -- the work list ---------------------------------------------------------------------
    def generation(self, host: str) -> int:
        with self._store.read() as session:
            return lookup.host_row(session, host).generation

    def work(self, host: str) -> WorkList:
        with self._store.read() as session:
            root = lookup.host_row(session, host)
            if root.parent_id is not None:
                raise ValidationError(f"host {host} is a child provider", field="host")
            return read_work_lists(session, [root.id])[root.id]

    # -- what the agent says ---------------------------------------------------------------
    def report(
        self,
        host: str,
        running: Sequence[str] | None,
        *,
        launching: Sequence[str] = (),
        seen_generation: int | None = None,
        as_of: datetime | None = None,
        usage: Mapping[str, float] | None = None,
        load: Mapping[str, float] | None = None,
    ) -> ReconcileResult:
        """Store the measurements, note the agent is alive, and reconcile the ledger with
        ``running`` (None: a report of measurements only).

        A report that says nothing new is a heartbeat: the same VMs, the same launches and
        the same ``seen_generation`` as the last report this process reconciled for the
        host, whose generation has not moved since, would change nothing in the ledger, so
        no ledger transaction is opened for it. Everything is checked before anything is
        written; a ``seen_generation`` beyond the host's generation is refused (a report
        may only claim to know what the server has said)."""
        if seen_generation is not None and (
            isinstance(seen_generation, bool)
            or not isinstance(seen_generation, int)
            or seen_generation < 0
        ):
            raise ValidationError(
                "seen_generation must be a host generation (an integer of at least 0)",
                field="seen_generation",
            )
        measures = check_measures(usage or {}, load or {})
        if running is not None and seen_generation is None:
            # Judged by the clock: a time the server cannot believe is refused before
            # anything is stored. By sequence the clock plays no part.
            as_of = check_as_of(as_of)
        result = ReconcileResult()
        new_vms = False
        if running is not None:
            said = _Said.of(running, launching, seen_generation)
            last = self._reconciled.get(host)
            # Judged by the clock, a later ``as_of`` may end claims an earlier one could
            # not: only reports judged by sequence are ever taken as heartbeats.
            new_vms = (
                seen_generation is None
                or last is None
                or last[0] != said
                or self._generation_now(host) != last[1]
            )
            if new_vms:
                result = self._ledger.reconcile(
                    host,
                    running,
                    as_of=as_of,
                    seen_generation=seen_generation,
                    launching=launching,
                )
                self._reconciled[host] = (said, (result.generation, self._commits(host)))
        if usage or load:
            # Only the measurements feed the scheduler (its load weigher); the list of VMs
            # is the ledger's business, reconciled (and kept with what the agent had seen)
            # above. In a server they are written with liveness, in bulk: a report of
            # measurements costs what a heartbeat does.
            watched = self._watched(host)
            if watched is not None:
                watched[0].measured(watched[1].id, *measures)
            else:
                self._scheduler.record_report(host, *measures, None)
        self._heard(host)
        return result

    def keeps_in_memory(self, host: str, running: Sequence[str] | None) -> bool:
        """Whether ``report(host, running, ...)`` touches nothing but memory: a report of
        measurements only (``running`` None), of a host this process's watcher holds, is
        kept for the watcher's next bulk write."""
        return running is None and self._watched(host) is not None

    def _generation_now(self, host: str) -> tuple[int, int]:
        """The host's generation, and how many commits of this process stamped it: from
        the watcher's cache in a server (one tick behind other processes at most; a
        report that repeats the last one is a no-op whatever changed since, this only
        narrows it further), else from the database."""
        watched = self._watched(host)
        if watched is None:
            return self.generation(host), 0
        watch, found = watched
        return watch.cached_generation(host) or 0, watch.commits(found.id)

    def _commits(self, host: str) -> int:
        watched = self._watched(host)
        return watched[0].commits(watched[1].id) if watched is not None else 0

    def _watched(self, host: str) -> tuple[HostWatch, WatchedHost] | None:
        """The server's watcher and its cached host, if there is one of each."""
        found = self.watch.cached_host(host) if self.watch is not None else None
        return (self.watch, found) if self.watch is not None and found is not None else None

    def _heard(self, host: str) -> None:
        watched = self._watched(host)
        if watched is not None:
            watched[0].heard(watched[1].id)
            return
        with self._store.write() as session:
            row = lookup.host_row(session, host)
            agent = session.get(HostAgentRow, row.id)
            if agent is not None:
                agent.last_seen_at = now()

    def launch_failed(self, vm: str, host: str, reason: str) -> LaunchFailure:
        """The host refused ``vm`` or could not start it: give the claim up and place the VM
        again, excluding every host that gave it up, while attempts are left."""
        outcome = self._ledger.fail(vm, host, reason)
        if outcome.kind != "launch":
            return LaunchFailure(outcome.vm, outcome.kind)
        tried = self._tried(vm)
        if len(tried) >= self.max_launch_attempts:
            self._give_up(vm, f"gave up after {len(tried)} hosts refused it ({', '.join(tried)})")
            return LaunchFailure(self._vm(vm), "launch")
        result = self._scheduler.schedule([RequestSpec(vms=[vm], exclude_hosts=tried)])
        placement = result.placements[0]
        if placement.error is not None:
            self._give_up(vm, f"no other host fits: {placement.error}")
        return LaunchFailure(self._vm(vm), "launch", placement)

    def migration_failed(self, vm: str, host: str, reason: str) -> LaunchFailure:
        outcome = self._ledger.fail(vm, host, reason)
        return LaunchFailure(outcome.vm, outcome.kind)

    def _tried(self, vm: str) -> list[str]:
        with self._store.read() as session:
            return list(lookup.vm_row(session, vm).tried_hosts)

    def _give_up(self, vm: str, why: str) -> None:
        with self._store.write() as session:
            row = lookup.vm_row(session, vm, lock=True)
            if row.state == "requested":
                # A fresh start later gets a fresh set of hosts to try.
                row.fault = f"{row.fault}; {why}" if row.fault else why
                row.tried_hosts = []

    def _vm(self, vm: str) -> VmRecord:
        with self._store.read() as session:
            return vm_records(session, [lookup.vm_row(session, vm)])[0]

    # -- liveness --------------------------------------------------------------------------
    @property
    def silent_after(self) -> timedelta:
        """How long an agent may say nothing before its host is silent; the scheduler's
        live-agent filter applies the same limit, so setting it here sets both."""
        return timedelta(seconds=self._scheduler.agent_silent_after)

    @silent_after.setter
    def silent_after(self, value: timedelta) -> None:
        self._scheduler.agent_silent_after = value.total_seconds()

    def status(self, host: str) -> AgentStatus:
        with self._store.read() as session:
            row = lookup.host_row(session, host)
            agent = session.get(HostAgentRow, row.root_id or row.id)
            if agent is None:
                return AgentStatus(row.name, "none")
            live = agent_live(
                epoch(agent.last_seen_at), epoch(now()), self.silent_after.total_seconds()
            )
            return AgentStatus(
                row.name,
                "ok" if live else "silent",
                agent.hypervisor_uri,
                agent.last_seen_at,
                agent.fence_failures,
                agent.fence_error,
            )
