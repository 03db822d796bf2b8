"""Log lines as operators read them, from the server, the agent and the demo alike: every
time in UTC with its offset, so lines from several machines and the API's answers are
read on one clock; as text, or one JSON object a line for a log collector."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import IO, Any, Literal

LogFormat = Literal["text", "json"]


def utc_time(record: logging.LogRecord, timespec: str = "milliseconds") -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec=timespec)


class UtcFormatter(logging.Formatter):
    """``%(asctime)s`` in UTC with its offset, to the millisecond."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_time(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra={"fields": {...}}`` adds keys."""

    def entry(self, record: logging.LogRecord) -> dict[str, Any]:
        return {
            "time": utc_time(record, "seconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }

    def format(self, record: logging.LogRecord) -> str:
        entry = self.entry(record)
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


# The agent's text lines: time, level, what happened. The logger's name is left out: an
# operator reads what the host did, not which module said it.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def log_to_stream(
    stream: IO[str], fmt: LogFormat = "text", level: int = logging.INFO
) -> logging.Handler:
    """Send loadmaster's log records at ``level`` and above to ``stream``, and only there."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else UtcFormatter(TEXT_FORMAT))
    root = logging.getLogger("loadmaster")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    return handler


@contextmanager
def logging_to(stream: IO[str], fmt: LogFormat = "text") -> Iterator[None]:
    """``log_to_stream`` while the block runs; loadmaster's logging as it was after it (a
    command run in-process, as tests do, leaves no handler on a stream that is gone)."""
    root = logging.getLogger("loadmaster")
    before = (root.handlers[:], root.level, root.propagate)
    log_to_stream(stream, fmt)
    try:
        yield
    finally:
        root.handlers[:], root.level, root.propagate = before
