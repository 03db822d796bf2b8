"""What a list of collectors declares (its fields, the mandatory ones), and whether a
sample is ready by it, as MOM's monitors judge."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadmaster.agent.sla.collectors.base import GuestCollector, HostCollector
from loadmaster.policy.snapshot import StatValue


@dataclass(frozen=True)
class Declaration:
    """What a list of collectors declares for one kind of entity, as a MOM monitor sees it."""

    fields: frozenset[str]
    mandatory: frozenset[str]

    @classmethod
    def of(cls, collectors: Sequence[HostCollector] | Sequence[GuestCollector]) -> Declaration:
        mandatory: set[str] = set()
        fields: set[str] = set()
        for collector in collectors:
            # Collectors written before the split declare no mandatory field.
            mandatory.update(getattr(collector, "mandatory_fields", ()))
            fields.update(collector.fields)
        return cls(frozenset(fields | mandatory), frozenset(mandatory))

    def missing(self, stats: Mapping[str, StatValue], properties: Mapping[str, Any]) -> list[str]:
        """The mandatory fields a sample lacks. ``None`` counts as lacking: these
        collectors answer None for what they could not read, where MOM's leave it out."""
        return sorted(
            f for f in self.mandatory if stats.get(f) is None and properties.get(f) is None
        )

    def unready(self, stats: Mapping[str, StatValue], properties: Mapping[str, Any]) -> str | None:
        """Why a sample is not ready (MOM's monitors' rule), or None when it is."""
        missing = self.missing(stats, properties)
        return f"mandatory {', '.join(missing)} missing" if missing else None
