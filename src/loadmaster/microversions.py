"""Placement's microversion range, and the one loadmaster's own clients ask for.

The API answers a request without ``OpenStack-API-Version`` at the minimum, 1.0, as
Placement does (OpenStack clients rely on it). loadmaster's CLI, agents and demo are
written against the maximum and say so on every request, so what they get never changes
under them when the API learns a newer microversion. Kept free of the web framework: the
agent and the CLI import it.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVICE_TYPE = "placement"
HEADER = "OpenStack-API-Version"


@dataclass(frozen=True, order=True)
class Version:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    def matches(self, major: int, minor: int) -> bool:
        """At least ``major.minor``: the test Placement's handlers use for a feature."""
        return self >= Version(major, minor)


MIN = Version(1, 0)
MAX = Version(1, 39)
# What loadmaster's own clients send (pinned, not "latest": see above).
CLIENT_HEADERS = {HEADER: f"{SERVICE_TYPE} {MAX}"}
