"""What an operator reading ``loadmaster agent``'s log learns of its SLA cycles: a cycle
that acted or failed gets a line of counts, then each failure once with its reason; a
quiet cycle (nothing applied, nothing failed, nothing new left out) gets none. A failure
that repeats cycle after cycle says so ("still failing since ...") instead of looking new
every time. Policy reloads, refused policy files and guests left out are logged by the
loop itself, once each (``loop.py``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from loadmaster.agent.sla.loop import CycleReport


@dataclass
class CycleNarrator:
    # (controller, target, error) -> (first cycle, its time) while it keeps failing
    _since: dict[tuple[str, str, str], tuple[int, datetime]] = field(default_factory=dict)
    _left_out: frozenset[str] = frozenset()

    def quiet(self, report: CycleReport) -> bool:
        """Nothing to tell: the cycle changed nothing and nothing in it went wrong anew."""
        return not (
            report.actions
            or report.failures
            or report.policy_reloaded
            or report.policy_file_errors
            or report.policy_error
            or report.host_not_ready
            or report.left_out.keys() - self._left_out
        )

    def lines(self, report: CycleReport, now: datetime) -> list[str]:
        """The summary, then one line per failure; none for a quiet cycle."""
        quiet = self.quiet(report)
        self._left_out = frozenset(report.left_out)
        current: dict[tuple[str, str, str], tuple[int, datetime]] = {}
        failures = []
        for failure in report.failures:
            key = (failure.controller, failure.target, failure.error)
            first = self._since.get(key)
            what = f"{failure.controller} on {failure.target}: {failure.error}"
            if first is None:
                current[key] = (report.cycle, now)
                failures.append(f"failed: {what}")
            else:
                current[key] = first
                cycles = report.cycle - first[0] + 1
                since = first[1].isoformat(timespec="seconds")
                failures.append(
                    f"still failing since cycle {first[0]} ({since}), {cycles} cycles: {what}"
                )
        # A failure that stopped and comes back later is new again.
        self._since = current
        if quiet:
            return []
        summary = (
            f"cycle {report.cycle}: {report.guests} guests, {len(report.actions)} actions, "
            f"{len(report.failures)} failures, {len(report.left_out)} guests left out, "
            f"{len(report.not_applied)} controls not applied, reported={report.reported}"
        )
        return [summary, *failures]

    def log(self, report: CycleReport, now: datetime, logger: logging.Logger) -> None:
        """The lines of ``lines``: the summary as information, failures as warnings."""
        for i, line in enumerate(self.lines(report, now)):
            logger.log(logging.INFO if i == 0 else logging.WARNING, "%s", line)
