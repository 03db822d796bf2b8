"""What the SLA loop sends the API: the host's measurements, when they moved.

The host manager reports the host's VMs when they change (``HostManager.report``); the
SLA loop's own reports only feed the scheduler's load weigher. Re-sending an unchanged
picture every cycle from every host is what kept a fleet's API busy standing still,
so a report goes out when a load moved by at least ``load_step`` (a
fraction of the host), a usage figure by at least ``usage_step`` of its last value, a
figure appeared or went, or the last report is ``max_age_s`` old. It carries the
figures alone, rounded: no VM list, no times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from loadmaster.agent.sla.loop import Reporter

DEFAULT_MAX_AGE_S = 300.0
DEFAULT_LOAD_STEP = 0.05
DEFAULT_USAGE_STEP = 0.05


class MeasurementReporter:
    """A ``Reporter`` for ``Agent(reporter=...)`` in front of the API's."""

    def __init__(
        self,
        send: Reporter,
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        load_step: float = DEFAULT_LOAD_STEP,
        usage_step: float = DEFAULT_USAGE_STEP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self.max_age_s = max_age_s
        self.load_step = load_step
        self.usage_step = usage_step
        self._clock = clock
        self._last: tuple[dict[str, float], dict[str, float]] | None = None
        self._sent_at = 0.0
        self.sent = 0

    def __call__(self, host: str, payload: Mapping[str, Any]) -> None:
        usage = {k: round(float(v), 1) for k, v in dict(payload.get("usage") or {}).items()}
        load = {k: round(float(v), 3) for k, v in dict(payload.get("load") or {}).items()}
        if not usage and not load:
            return
        if not self._due(usage, load):
            return
        self._send(host, {"usage": usage, "load": load})
        self._last, self._sent_at = (usage, load), self._clock()
        self.sent += 1

    def _due(self, usage: dict[str, float], load: dict[str, float]) -> bool:
        if self._last is None or self._clock() - self._sent_at >= self.max_age_s:
            return True
        last_usage, last_load = self._last
        if usage.keys() != last_usage.keys() or load.keys() != last_load.keys():
            return True
        if any(abs(load[k] - last_load[k]) >= self.load_step for k in load):
            return True
        return any(
            abs(usage[k] - last_usage[k]) >= self.usage_step * max(abs(last_usage[k]), 1.0)
            for k in usage
        )
