"""Reading the host's ``/proc`` files, for the host collectors."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc)
        return None


def parse_key_values(text: str | None) -> dict[str, int]:
    """``/proc/meminfo`` (``MemTotal:  16 kB``) and ``/proc/vmstat`` (``pswpin 3``) lines."""
    values: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2:
            try:
                values[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return values
