"""What a controller is: the contract, what it is handed each cycle (``ControlContext``)
and what it reports (``Outcome``: ``Action``s and ``Failure``s), and building the
registered ones."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from loadmaster.agent.hypervisor.base import GuestInfo, Hypervisor, HypervisorError
from loadmaster.agent.sla.plugins import CONTROLLER_GROUP, registered
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot

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

    def guest_controls(self) -> Iterator[tuple[GuestInfo, Mapping[str, Any], EntitySnapshot]]:
        """Each guest the cycle computed controls for, with them and its snapshot; a guest
        gone since it was sampled is left out."""
        for name, controls in self.result.guest_controls.items():
            guest = self.guests.get(name)
            if guest is not None:
                yield guest, controls, self.snapshots[name]


@dataclass
class Outcome:
    actions: list[Action] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    on_applied: Callable[[Action], None] | None = None

    def applied(self, action: Action) -> None:
        self.actions.append(action)
        if self.on_applied is not None:
            self.on_applied(action)


@dataclass(frozen=True)
class ControllerSources:
    """What controllers are built from (see ``loadmaster.agent.sla.plugins``)."""

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
        return [
            (guest, snapshot, controls[control])
            for guest, controls, snapshot in ctx.guest_controls()
            if controls.get(control) is not None
        ]

    def _send_changed(
        self,
        out: Outcome,
        guest: GuestInfo,
        wanted: Mapping[str, Any],
        sampled: Mapping[str, Any],
        call: Callable[..., object],
        keywords: Mapping[str, str],
    ) -> None:
        """The controls of ``wanted`` that differ from what is in force, sent together as
        ``call(guest.uuid, **{keywords[control]: value})``, the unchanged ones as None;
        nothing is sent when none changed."""
        changed = self._changed(guest, wanted, sampled)
        if changed:
            values = {keyword: changed.get(control) for control, keyword in keywords.items()}
            self._carry_out(out, guest, partial(call, guest.uuid, **values), changed)


class HypervisorController(Controller):
    """A controller that acts through the hypervisor alone."""

    def __init__(self, hypervisor: Hypervisor) -> None:
        super().__init__()
        self.hypervisor = hypervisor

    @classmethod
    def build(cls, sources: ControllerSources) -> Controller | None:
        return cls(sources.hypervisor)


def default_controllers(
    hypervisor: Hypervisor, migration_sender: MigrationSender | None = None
) -> list[Controller]:
    """Every registered controller that applies, in ``order``."""
    sources = ControllerSources(hypervisor, migration_sender)
    built = [ep.load()(sources) for ep in registered(CONTROLLER_GROUP).values()]
    return sorted((c for c in built if c is not None), key=lambda c: (c.order, c.name))
