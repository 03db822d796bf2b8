"""The samples an entity had in the last cycles, for the policies' ``StatAvg``."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from loadmaster.policy.snapshot import StatValue

DEFAULT_HISTORY = 10


class History:
    """The last samples of every entity, oldest first, for ``StatAvg``."""

    def __init__(self, length: int = DEFAULT_HISTORY) -> None:
        self.length = length
        self._samples: dict[str, deque[Mapping[str, StatValue]]] = {}

    def add(
        self, entity: str, stats: Mapping[str, StatValue]
    ) -> tuple[Mapping[str, StatValue], ...]:
        samples = self._samples.get(entity)
        if samples is None:
            samples = self._samples[entity] = deque(maxlen=self.length)
        samples.append(stats)
        return tuple(samples)

    def samples(self, entity: str) -> tuple[Mapping[str, StatValue], ...]:
        return tuple(self._samples.get(entity, ()))

    def keep_only(self, entities: set[str]) -> None:
        for name in [n for n in self._samples if n not in entities]:
            del self._samples[name]
