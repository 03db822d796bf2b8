"""What an operator watching ``loadmaster agent`` reads after each cycle: the counts,
then what failed, each failure once with its reason. A failure that repeats cycle after
cycle says so ("still failing since ...") instead of looking new every time."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from loadmaster.agent.loop import CycleReport


@dataclass
class CycleNarrator:
    # (controller, target, error) -> (first cycle, its time) while it keeps failing
    _since: dict[tuple[str, str, str], tuple[int, datetime]] = field(default_factory=dict)

    def lines(self, report: CycleReport, now: datetime) -> list[str]:
        lines = [
            f"cycle {report.cycle}: {report.guests} guests, {len(report.actions)} actions, "
            f"{len(report.failures)} failures, {len(report.left_out)} guests left out, "
            f"{len(report.not_applied)} controls not applied, reported={report.reported}"
        ]
        if report.policy_reloaded:
            lines.append("  policy reloaded from its directory")
        lines += [f"  policy file refused: {error}" for error in report.policy_file_errors]
        if report.policy_error:
            lines.append(f"  policy failed: {report.policy_error}")
        if report.host_not_ready:
            lines.append(f"  host not ready, cycle skipped: {report.host_not_ready}")
        lines += [f"  guest {name} left out: {why}" for name, why in report.left_out.items()]
        current: dict[tuple[str, str, str], tuple[int, datetime]] = {}
        for failure in report.failures:
            key = (failure.controller, failure.target, failure.error)
            first = self._since.get(key)
            what = f"{failure.controller} on {failure.target}: {failure.error}"
            if first is None:
                current[key] = (report.cycle, now)
                lines.append(f"  failed: {what}")
            else:
                current[key] = first
                cycles = report.cycle - first[0] + 1
                since = first[1].isoformat(timespec="seconds")
                lines.append(
                    f"  still failing since cycle {first[0]} ({since}), {cycles} cycles: {what}"
                )
        # A failure that stopped and comes back later is new again.
        self._since = current
        return lines
