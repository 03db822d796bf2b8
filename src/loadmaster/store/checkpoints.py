"""SQLite's write-ahead log folded back into the database by a thread of its own.

By default the commit that takes the log past 1,000 pages copies them into the database
file itself, inside the writer's turn: the slowest commits took many times the median,
every writer of the process queueing behind the one that checkpoints. With automatic
checkpoints off and a thread doing a PASSIVE checkpoint shortly after writes (it waits
for no reader or writer, and SQLite releases the GIL while it copies), the slowest
commits stay near the median (docs/architecture.md has the figures).

The thread starts at the first write of the process that owns it (a forked child starts
its own), sleeps while nothing is written (an idle server does nothing), and stops with
the store. When the last connection to the database closes SQLite checkpoints and removes
the log itself, so a short-lived process needs nothing more.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading

log = logging.getLogger("loadmaster.store")

# After a write, how long the thread lets further commits gather before it checkpoints:
# a busy writer's log is folded back about ten times a second, not after every commit.
GATHER_S = 0.1


class Checkpointer:
    def __init__(self, path: str) -> None:
        self._path = path
        self._wrote = threading.Event()
        self._stop = threading.Event()
        self._owner: int | None = None  # the process whose thread runs
        self._start_lock = threading.Lock()
        self.thread: threading.Thread | None = None
        # How many checkpoints ran, and the last one's answer: (1 if it could not finish,
        # frames in the log, frames folded back).
        self.checkpoints = 0
        self.last: tuple[int, int, int] | None = None

    def wrote(self) -> None:
        """A write transaction committed: checkpoint soon."""
        if self._owner != os.getpid():
            self._start()
        self._wrote.set()

    def close(self) -> None:
        self._stop.set()
        self._wrote.set()

    def _start(self) -> None:
        with self._start_lock:
            if self._owner == os.getpid() or self._stop.is_set():
                return
            # A fork's copy of the event may be set or held: a fresh one for this process.
            self._wrote = threading.Event()
            self._owner = os.getpid()
            self.thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        wrote = self._wrote
        connection = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            while True:
                wrote.wait()
                # Cleared before the pause: a commit during it is checkpointed now or next.
                wrote.clear()
                if self._stop.wait(GATHER_S):
                    return
                try:
                    self.last = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self.checkpoints += 1
                except sqlite3.Error as exc:  # another process's checkpoint holds the lock
                    log.debug("checkpoint skipped: %s", exc)
        finally:
            connection.close()
