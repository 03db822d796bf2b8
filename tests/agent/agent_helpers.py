"""Shared by the agent tests: fixture paths, a fake policy, an agent on the simulator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
