"""The Python API's front door: one object holding every service over one store."""

from __future__ import annotations

import shlex

from loadmaster.cluster import (
    FlavorService,
    GroupService,
    HostService,
    ResourceClassService,
    TraitService,
    VmService,
    sync_standard_vocabulary,
)
from loadmaster.cluster.images import ImageService
from loadmaster.hostcontrol import HostControl
from loadmaster.hostcontrol.devices import DeviceViews
from loadmaster.hostcontrol.evacuation import EvacuationService
from loadmaster.pending import Ledger
from loadmaster.pending.waiting import WaitingClaims
from loadmaster.resources.aliases import parse_aliases
from loadmaster.scheduler import Scheduler
from loadmaster.scheduler.core.policies import load_policy_file
from loadmaster.scheduler.drain import DrainService
from loadmaster.settings_model import Settings, load_settings
from loadmaster.store import Store


class Loadmaster:
    """``lm = loadmaster.open(url)``; then ``lm.hosts``, ``lm.flavors``, ``lm.vms``,
    ``lm.images`` (the image catalogue), ``lm.allocations`` (claims, activation, release,
    usage), ``lm.resource_classes``, ``lm.traits``, ``lm.devices`` (host devices and who
    holds them), ``lm.maintenance`` (drain a host), ``lm.waiting`` (claims waiting on hosts that cannot
    act), ``lm.evacuation`` (a dead host's VMs started elsewhere). ``settings`` (default:
    the environment's) choose the
    scheduler's default policy and policy file, how flavors treat unknown extra specs, and
    whether allocation candidates are shuffled."""

    def __init__(self, store: Store, settings: Settings | None = None) -> None:
        settings = settings or load_settings()
        self.store = store
        self.resource_classes = ResourceClassService(store)
        self.traits = TraitService(store)
        self.hosts = HostService(store)
        self.flavors = FlavorService(
            store, settings.unknown_specs, parse_aliases(settings.pci_aliases)
        )
        self.images = ImageService(store)
        self.vms = VmService(store)
        self.allocations = Ledger(
            store, randomize_candidates=settings.randomize_allocation_candidates
        )
        self.groups = GroupService(store)
        self.scheduler = scheduler_for(store, settings)
        self.devices = DeviceViews(store)
        self.host_agents = HostControl(
            store,
            self.hosts,
            self.resource_classes,
            self.allocations,
            self.scheduler,
            silent_after_s=settings.agent_silent_after,
            heard_every_s=settings.agent_heard_every,
        )
        self.waiting = WaitingClaims(
            store, lambda: self.host_agents.silent_after, settings.pending_warn_after
        )
        self.maintenance = DrainService(store, self.scheduler, self.allocations, self.waiting)
        self.evacuation = EvacuationService(
            store,
            self.scheduler,
            self.host_agents,
            fence_command=shlex.split(settings.fence_command),
            fence_timeout_s=settings.fence_timeout,
        )

    def close(self) -> None:
        self.store.dispose()

    def __enter__(self) -> Loadmaster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def scheduler_for(store: Store, settings: Settings) -> Scheduler:
    """The scheduler ``settings`` describe: its default policy, the operator's policies."""
    return Scheduler(
        store,
        default_policy=settings.scheduler_policy,
        policies=load_policy_file(settings.policies_file) if settings.policies_file else None,
        agent_silent_after=settings.agent_silent_after,
    )


def open_loadmaster(
    url: str | None = None, *, migrate: bool = True, settings: Settings | None = None
) -> Loadmaster:
    """Connect to ``url`` (default: the ``db`` setting, ``$LOADMASTER_DB``, else the SQLite
    file ``loadmaster.db``; or ``postgresql+psycopg://...``), bring the schema up to date
    and make sure the standard classes and traits exist."""
    settings = settings or load_settings()
    store = Store(url or settings.db, fast_statements=settings.fast_statements)
    if migrate:
        store.migrate()
        sync_standard_vocabulary(store)
    return Loadmaster(store, settings)
