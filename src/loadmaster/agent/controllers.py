"""Controllers: turn the controls a policy cycle recorded into hypervisor calls.

Each controller remembers the value it last applied per target and only calls the
hypervisor when the policy asks for something different (before the first call, the
sampled value stands in). A value is remembered, and handed to the context's
``on_applied`` (the agent's journal), only once the call succeeded, so a failed or
interrupted call is simply retried next cycle. One target failing does not
stop the others; the agent isolates whole controllers from each other the same way.

This module holds the controllers, one class per control, as MOM's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from loadmaster.agent.hypervisor.base import (
    NET_DIRECTIONS,
    NET_KEYS,
    NET_LIMIT_MAX,
    NET_PARAMS,
    NUMA_MODES,
    GuestInfo,
    Hypervisor,
    HypervisorError,
    format_nodeset,
    parse_nodeset,
)
from loadmaster.agent.plugins import CONTROLLER_GROUP, registered
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot
from loadmaster.tiers import Tier, priority_of, tier_of

log = logging.getLogger(__name__)

# libvirt's accepted ranges (virsh schedinfo): a negative quota means "no limit".
QUOTA_UNLIMITED = -1
# The balloon moves whole pages: QEMU leaves a guest its target rounded up to 4 KiB.
BALLOON_PAGE_KIB = 4
QUOTA_MIN, QUOTA_MAX = 1000, 17_592_186_044_415
PERIOD_MIN, PERIOD_MAX = 1000, 1_000_000
SHARES_MIN, SHARES_MAX = 2, 262_144

MigrationSender = Callable[[str, str], object]
"""``(vm_uuid, reason)``; raises on failure so the request is retried next cycle. What it
returns (the runner's client says whether a migration began) is not the agent's concern."""


@dataclass(frozen=True)
class Action:
    """A control the hypervisor accepted; ``uuid`` is the guest's, None for host controls."""

    controller: str
    target: str
    control: str
    value: Any
    uuid: str | None = None


@dataclass(frozen=True)
class Failure:
    controller: str
    target: str
    error: str


@dataclass(frozen=True)
class ControlContext:
    """One successful policy cycle and what it was computed from; guests keyed by name.
    ``on_applied`` hears of every action as soon as its call succeeded, before the next."""

    result: CycleResult
    host: EntitySnapshot
    guests: Mapping[str, GuestInfo]
    snapshots: Mapping[str, EntitySnapshot]
    on_applied: Callable[[Action], None] | None = None

    def outcome(self) -> Outcome:
        return Outcome(on_applied=self.on_applied)


@dataclass
class Outcome:
    actions: list[Action] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    on_applied: Callable[[Action], None] | None = None

    def applied(self, action: Action) -> None:
        self.actions.append(action)
        if self.on_applied is not None:
            self.on_applied(action)


def libvirt_quota(value: float) -> int:
    """A policy quota as libvirt accepts it: any non-positive value (the policies' reset,
    -1) is "unlimited"; anything else is clamped to libvirt's range."""
    quota = int(value)
    if quota <= 0:
        return QUOTA_UNLIMITED
    return min(QUOTA_MAX, max(QUOTA_MIN, quota))


def libvirt_period(value: float) -> int:
    return min(PERIOD_MAX, max(PERIOD_MIN, int(value)))


def libvirt_shares(value: float) -> int:
    return min(SHARES_MAX, max(SHARES_MIN, int(value)))


@dataclass(frozen=True)
class ControllerSources:
    """What controllers are built from (see ``loadmaster.agent.plugins``)."""

    hypervisor: Hypervisor
    migration_sender: MigrationSender | None = None


class Controller:
    name = "controller"
    # Controllers run in this order, then by name: a VM is stopped or sent away only
    # after its other controls of the cycle were applied.
    order = 50

    def __init__(self) -> None:
        self._applied: dict[tuple[str, str], Any] = {}

    @classmethod
    def build(cls, sources: ControllerSources) -> Controller | None:
        """The entry-point factory; None where the controller does not apply."""
        raise NotImplementedError

    def apply(self, ctx: ControlContext) -> Outcome:
        raise NotImplementedError

    def forget(self, targets: set[str]) -> None:
        """Drop what was applied to targets that are gone (a VM that comes back starts over)."""
        self._applied = {k: v for k, v in self._applied.items() if k[0] in targets}

    def _last(self, target: str, control: str, sampled: Any) -> Any:
        return self._applied.get((target, control), sampled)

    def _changed(
        self, guest: GuestInfo, wanted: Mapping[str, Any], sampled: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The controls in ``wanted`` whose value differs from what is in force."""
        return {
            control: value
            for control, value in wanted.items()
            if value != self._last(guest.uuid, control, sampled.get(control))
        }

    def _carry_out(
        self,
        out: Outcome,
        guest: GuestInfo,
        call: Callable[[], object],
        applied: Mapping[str, Any],
        *,
        reported: set[str] | None = None,
        failure_prefix: str = "",
    ) -> None:
        """One hypervisor call for ``applied`` (control -> value). Only a call that returned
        makes its values remembered and reported (``reported``: which of them, default all),
        so a failed call is retried next cycle."""
        try:
            call()
        except HypervisorError as exc:
            out.failures.append(Failure(self.name, guest.name, f"{failure_prefix}{exc}"))
            return
        for control, value in applied.items():
            self._applied[(guest.uuid, control)] = value
            if reported is None or control in reported:
                out.applied(Action(self.name, guest.name, control, value, guest.uuid))

    def _guest_controls(
        self, ctx: ControlContext, control: str
    ) -> list[tuple[GuestInfo, EntitySnapshot, Any]]:
        found = []
        for name, controls in ctx.result.guest_controls.items():
            value = controls.get(control)
            guest = ctx.guests.get(name)
            if value is not None and guest is not None:
                found.append((guest, ctx.snapshots[name], value))
        return found


class HypervisorController(Controller):
    """A controller that acts through the hypervisor alone."""

    def __init__(self, hypervisor: Hypervisor) -> None:
        super().__init__()
        self.hypervisor = hypervisor

    @classmethod
    def build(cls, sources: ControllerSources) -> Controller | None:
        return cls(sources.hypervisor)


class BalloonController(HypervisorController):
    """``balloon_target`` (KiB), in whole 4 KiB pages, kept within the guest's guaranteed
    minimum and its size."""

    name = "balloon"

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for guest, snap, value in self._guest_controls(ctx, "balloon_target"):
            # Asked as QEMU will set it, so the target is what the guest's stats then show
            # (and rounding up never cuts below a tier's floor).
            target = -(-int(value) // BALLOON_PAGE_KIB) * BALLOON_PAGE_KIB
            low, high = snap.stats.get("balloon_min"), snap.stats.get("balloon_max")
            if high is not None and high > 0:
                target = min(target, int(high))
            if low is not None:
                target = max(target, int(low))
            if target == self._last(guest.uuid, "balloon_target", snap.stats.get("balloon_cur")):
                continue
            self._carry_out(
                out,
                guest,
                partial(self.hypervisor.set_memory, guest.uuid, target),
                {"balloon_target": target},
            )
        return out


class KsmController(HypervisorController):
    """Host ``ksm_*`` controls, written to the KSM knobs of the same name.

    The kernel refuses a new ``merge_across_nodes`` while pages are shared, so that change
    is made as: unmerge (``run=2``), write ``merge_across_nodes``, then restore ``run``.
    """

    name = "ksm"
    HOST = "host"

    def forget(self, targets: set[str]) -> None:
        return

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        wanted = {
            key[4:]: int(value)
            for key, value in ctx.result.host_controls.items()
            if key.startswith("ksm_") and value is not None
        }

        def current(knob: str) -> Any:
            return self._last(self.HOST, knob, ctx.host.stats.get(f"ksm_{knob}"))

        changed = {k: v for k, v in wanted.items() if v != current(k)}
        writes: list[tuple[str, int]] = []
        if "merge_across_nodes" in changed:
            previous_run = current("run")
            run_after = changed.pop("run", wanted.get("run", previous_run))
            writes += [("run", 2), ("merge_across_nodes", changed.pop("merge_across_nodes"))]
            if run_after is not None and run_after != 2:
                writes.append(("run", int(run_after)))
        # Tune the scan before starting it, so KSM never runs a cycle with stale settings.
        run = changed.pop("run", None)
        writes += sorted(changed.items())
        if run is not None:
            writes.append(("run", run))
        for knob, value in writes:
            try:
                self.hypervisor.ksm_write(knob, value)
            except HypervisorError as exc:
                # Later writes depend on earlier ones (never merge-change without the unmerge).
                out.failures.append(Failure(self.name, self.HOST, str(exc)))
                break
            self._applied[(self.HOST, knob)] = value
            out.applied(Action(self.name, self.HOST, f"ksm_{knob}", value))
        return out


class CpuTuneController(HypervisorController):
    """``vcpu_quota``, ``vcpu_period`` (µs) and ``vcpu_shares``, translated to values libvirt
    accepts, sent together in one call when any of them changed."""

    name = "cputune"
    _CONTROLS = (
        ("vcpu_quota", libvirt_quota),
        ("vcpu_period", libvirt_period),
        ("vcpu_shares", libvirt_shares),
    )

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for name, controls in ctx.result.guest_controls.items():
            guest = ctx.guests.get(name)
            if guest is None:
                continue
            wanted = {
                control: translate(controls[control])
                for control, translate in self._CONTROLS
                if controls.get(control) is not None
            }
            changed = self._changed(guest, wanted, ctx.snapshots[name].stats)
            if not changed:
                continue
            self._carry_out(
                out,
                guest,
                partial(
                    self.hypervisor.set_cpu_tune,
                    guest.uuid,
                    quota=changed.get("vcpu_quota"),
                    period=changed.get("vcpu_period"),
                    shares=changed.get("vcpu_shares"),
                ),
                changed,
            )
        return out


class IoTuneController(HypervisorController):
    """MOM's ``io_tune`` request: per disk, the six limits to set (nil keeps a limit)."""

    name = "iotune"

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for guest, _snap, request in self._guest_controls(ctx, "io_tune"):
            for entry in request:
                disk = str(entry.get("name") or entry.get("path") or "")
                limits = {k: int(v) for k, v in entry.get("ioTune", {}).items() if v is not None}
                key = f"io_tune:{disk}"
                if not disk or not limits or limits == self._last(guest.uuid, key, None):
                    continue
                self._carry_out(
                    out,
                    guest,
                    partial(self.hypervisor.set_io_tune, guest.uuid, disk, limits),
                    {key: limits},
                )
        return out


class StopController(HypervisorController):
    """``stop`` = 1 on a VM of a stoppable tier (vapor): a clean shutdown first; if the VM
    is still running at a later cycle that asks again, it is destroyed. Other tiers are
    never stopped, whatever the policy asks."""

    name = "stop"
    order = 80

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for guest, _snap, value in self._guest_controls(ctx, "stop"):
            if int(value) != 1:
                continue
            tier = tier_of(guest.tags)
            if not tier.stoppable:
                out.failures.append(
                    Failure(self.name, guest.name, f"refused: {_never_stopped(tier)}")
                )
                continue
            force = self._applied.get((guest.uuid, "stop")) == "shutdown"
            try:
                self.hypervisor.stop_guest(guest.uuid, force=force)
            except HypervisorError as exc:
                out.failures.append(Failure(self.name, guest.name, str(exc)))
                continue
            how = "destroy" if force else "shutdown"
            self._applied[(guest.uuid, "stop")] = how
            out.applied(Action(self.name, guest.name, "stop", how, guest.uuid))
        return out


def _never_stopped(tier: Tier) -> str:
    return f"a {tier.name} VM is never stopped"


def asks(controls: Mapping[str, Any], control: str) -> bool:
    """Whether the policy requests ``control`` (``stop``, ``migrate``): the value 1,
    truncated as MOM's controllers do."""
    value = controls.get(control)
    return isinstance(value, int | float) and int(value) == 1


def stop_wins(controls: Mapping[str, Any], tags: Collection[str]) -> bool:
    """The policy asks to stop a VM of a stoppable tier: it is powered off and not also
    sent away, since a move of a VM shutting down would be left in flight, its source
    no longer running it. Any other tier is never stopped, so a move it is asked goes on."""
    return asks(controls, "stop") and tier_of(tags).stoppable


def stop_or_migrate(controls: Mapping[str, Any], tags: Collection[str]) -> str | None:
    """For a guest the policy asks both to stop and to migrate, which the agent carries
    out and why; None when it does not ask both."""
    if not (asks(controls, "stop") and asks(controls, "migrate")):
        return None
    tier = tier_of(tags)
    if stop_wins(controls, tags):
        return f"stop: a {tier.name} VM is powered off, and not also asked to move"
    return f"migrate: {_never_stopped(tier)}, so the agent refuses stop and asks to move it"


class MigrationController(Controller):
    """``migrate`` = 1: ask the scheduler once to move the VM; asked again only after the
    policy stopped asking for a cycle."""

    name = "migrate"
    order = 90

    def __init__(self, send: MigrationSender) -> None:
        super().__init__()
        self.send = send

    @classmethod
    def build(cls, sources: ControllerSources) -> Controller | None:
        return None if sources.migration_sender is None else cls(sources.migration_sender)

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        asking = set()
        for guest, _snap, value in self._guest_controls(ctx, "migrate"):
            if int(value) != 1 or stop_wins(ctx.result.guest_controls[guest.name], guest.tags):
                continue
            asking.add(guest.uuid)
            if (guest.uuid, "migrate") in self._applied:
                continue
            reason = self._reason(ctx, guest)
            try:
                self.send(guest.uuid, reason)
            except Exception as exc:  # the sender is any client; its failure is retried
                out.failures.append(Failure(self.name, guest.name, f"{type(exc).__name__}: {exc}"))
                continue
            self._applied[(guest.uuid, "migrate")] = reason
            out.applied(Action(self.name, guest.name, "migrate", reason, guest.uuid))
        self.forget(asking)
        return out

    @staticmethod
    def _reason(ctx: ControlContext, guest: GuestInfo) -> str:
        tier, priority = tier_of(guest.tags).name, priority_of(guest.tags)
        total, free = ctx.host.stats.get("mem_available"), ctx.host.stats.get("mem_free")
        pressure = f", {100 * free / total:.1f}% memory free" if total and free is not None else ""
        return (
            f"SLA policy on host {ctx.host.name}: {tier} VM (priority {priority}) "
            f"moved off{pressure}"
        )


# -- network bandwidth and NUMA memory tuning ---------------------------------------------

# The guest control for each libvirt interface parameter: "inbound.average" is set by
# ``net_inbound_average``. ``<control>@<interface>`` sets it for one interface only and
# wins over the plain control, which applies to every interface of the guest.
NET_CONTROLS: dict[str, str] = {key: f"net_{key.replace('.', '_')}" for key in NET_KEYS}
NET_INTERFACE_SEPARATOR = "@"


def net_limit(value: Any) -> int:
    """A policy limit as libvirt accepts it: non-positive is "no limit" (0), and the
    value is capped at libvirt's unsigned int."""
    return min(NET_LIMIT_MAX, max(0, int(value)))


class NetTuneController(HypervisorController):
    """Per interface, the ``net_<direction>_<average|peak|burst>`` controls (KiB/s, burst
    KiB; 0 = no limit). libvirt wants a direction's average whenever its peak or burst is
    set, so a change sends the whole direction: the new values and the last known rest."""

    name = "nettune"

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for name, controls in ctx.result.guest_controls.items():
            guest = ctx.guests.get(name)
            if guest is None:
                continue
            sampled = ctx.snapshots[name].properties.get("net_bandwidth") or {}
            for interface in guest.interfaces:
                self._apply_interface(guest, interface, controls, sampled.get(interface, {}), out)
        return out

    def _apply_interface(
        self,
        guest: GuestInfo,
        interface: str,
        controls: Mapping[str, Any],
        sampled: Mapping[str, int],
        out: Outcome,
    ) -> None:
        current = {
            key: self._last(guest.uuid, self._control(key, interface), sampled.get(key))
            for key in NET_KEYS
        }
        wanted: dict[str, int] = {}
        for key, control in NET_CONTROLS.items():
            value = controls.get(f"{control}{NET_INTERFACE_SEPARATOR}{interface}")
            if value is None:
                value = controls.get(control)
            if value is None:
                continue
            try:
                wanted[key] = net_limit(value)
            except (TypeError, ValueError):
                out.failures.append(
                    Failure(self.name, guest.name, f"refused: {control}={value!r} is no number")
                )
                return
        for direction in NET_DIRECTIONS:
            # As libvirt does: a direction without an average has no peak or burst either,
            # so what is remembered is what the interface really has.
            if wanted.get(f"{direction}.average") == 0:
                wanted.update({f"{direction}.{p}": 0 for p in NET_PARAMS})
        changed = {k for k, v in wanted.items() if v != current[k]}
        if not changed:
            return
        limits: dict[str, int] = {}
        for direction in NET_DIRECTIONS:
            keys = [f"{direction}.{p}" for p in NET_PARAMS]
            if changed.intersection(keys):
                limits.update({k: wanted.get(k, current[k] or 0) for k in keys})
        self._carry_out(
            out,
            guest,
            partial(self.hypervisor.set_interface_bandwidth, guest.uuid, interface, limits),
            {self._control(key, interface): value for key, value in limits.items()},
            reported={self._control(key, interface) for key in changed},
            failure_prefix=f"{interface}: ",
        )

    @staticmethod
    def _control(key: str, interface: str) -> str:
        """How an applied limit is remembered and journalled: per interface."""
        return f"{NET_CONTROLS[key]}{NET_INTERFACE_SEPARATOR}{interface}"


class NumaTuneController(HypervisorController):
    """``numa_mode`` (one of ``NUMA_MODES``) and ``numa_nodeset`` (libvirt's syntax, e.g.
    "0-1"; a number is one node): where the guest's memory is placed, set in one call
    when either changed. A value libvirt would refuse is reported and not sent. libvirt
    (QEMU) changes a running guest's node set only in strict mode and never its mode:
    those refusals come back as failures, retried while the policy asks."""

    name = "numatune"

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        for name, controls in ctx.result.guest_controls.items():
            guest = ctx.guests.get(name)
            mode, nodeset = controls.get("numa_mode"), controls.get("numa_nodeset")
            if guest is None or (mode is None and nodeset is None):
                continue
            try:
                wanted = self._wanted(mode, nodeset)
            except ValueError as exc:
                out.failures.append(Failure(self.name, guest.name, f"refused: {exc}"))
                continue
            changed = self._changed(guest, wanted, ctx.snapshots[name].properties)
            if not changed:
                continue
            self._carry_out(
                out,
                guest,
                partial(
                    self.hypervisor.set_numa_tune,
                    guest.uuid,
                    mode=changed.get("numa_mode"),
                    nodeset=changed.get("numa_nodeset"),
                ),
                changed,
            )
        return out

    @staticmethod
    def _wanted(mode: Any, nodeset: Any) -> dict[str, str]:
        wanted: dict[str, str] = {}
        if mode is not None:
            if mode not in NUMA_MODES:
                raise ValueError(f"numa_mode {mode!r} is not one of {', '.join(NUMA_MODES)}")
            wanted["numa_mode"] = mode
        if nodeset is not None:
            # The policy language has no integers-as-strings: node 0 arrives as 0 or 0.0.
            text = str(int(nodeset)) if isinstance(nodeset, int | float) else str(nodeset)
            wanted["numa_nodeset"] = format_nodeset(parse_nodeset(text))
        return wanted


def default_controllers(
    hypervisor: Hypervisor, migration_sender: MigrationSender | None = None
) -> list[Controller]:
    """Every registered controller that applies, in ``order``."""
    sources = ControllerSources(hypervisor, migration_sender)
    built = [ep.load()(sources) for ep in registered(CONTROLLER_GROUP).values()]
    return sorted((c for c in built if c is not None), key=lambda c: (c.order, c.name))
