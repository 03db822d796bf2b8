"""Shared by the agent tests: fixture paths, a fake policy, a cycle's context for controllers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadmaster.agent.hypervisor.base import GuestInfo
from loadmaster.agent.sla.collectors import GuestCollector
from loadmaster.agent.sla.controllers import ControlContext
from loadmaster.policy import PolicyError
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NODE_XML = FIXTURES / "node.xml"


class FakePolicy:
    """Stands in for ``loadmaster.policy.Policy``: returns fixed controls, or raises."""

    def __init__(
        self,
        host_controls: Mapping[str, Any] | None = None,
        guest_controls: Mapping[str, Mapping[str, Any]] | None = None,
        error: PolicyError | None = None,
    ) -> None:
        self.host_controls = dict(host_controls or {})
        self.guest_controls = dict(guest_controls or {})
        self.error = error
        self.seen: list[tuple[EntitySnapshot, list[EntitySnapshot]]] = []

    def evaluate(self, host: EntitySnapshot, guests: Sequence[EntitySnapshot]) -> CycleResult:
        self.seen.append((host, list(guests)))
        if self.error is not None:
            raise self.error
        return CycleResult(self.host_controls, self.guest_controls)

    def loader(self, _directory: Path) -> FakePolicy:
        return self


def collected_context(
    guests: Iterable[GuestInfo],
    collectors: Sequence[GuestCollector],
    guest_controls: Mapping[str, Mapping[str, Any]],
) -> ControlContext:
    """A cycle's context asking ``guest_controls`` of ``guests``, whose snapshots the
    agent's ``collectors`` took."""
    by_name = {g.name: g for g in guests}
    snapshots = {}
    for g in by_name.values():
        stats: dict[str, Any] = {}
        properties: dict[str, Any] = {}
        for collector in collectors:
            values, props = collector.collect(g)
            stats.update(values)
            properties.update(props)
        snapshots[g.name] = EntitySnapshot(g.name, stats, (), properties, g.tags)
    result = CycleResult({}, {name: dict(c) for name, c in guest_controls.items()})
    return ControlContext(result, EntitySnapshot("host", {}), by_name, snapshots)
