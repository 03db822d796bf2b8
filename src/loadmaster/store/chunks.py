"""Long ``IN (...)`` lists are sent in pieces."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

# SQLite builds of old allowed 999 bound parameters per statement; a query may bind two
# lists of this size (names and uuids) and still stay under it.
IN_LIST_ROWS = 500


def in_chunks(items: Sequence[T], size: int = IN_LIST_ROWS) -> Iterator[list[T]]:
    """``items`` in consecutive lists of at most ``size``, in order."""
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
