"""``loadmaster serve --workers N``: its supervisor's own jobs, beside uvicorn's.

The supervisor is uvicorn's multiprocess one, changed where it failed under load; the
changes to it are in ``api.uvicorn_workers``, the one module that overrides uvicorn's
internals (a test pins the uvicorn they were written against). What is loadmaster's own
is here, apart from uvicorn:

- a worker, as the scheduling process, dies with its supervisor, SIGKILL included
  (Linux's ``PR_SET_PDEATHSIG``, ``die_with``): orphans would keep answering on the port,
  with whatever tokens they started with;
- the one scheduling process the workers hand their placements to
  (``api.scheduling_process``, ``SchedulingProcess``): started before them, replaced when
  it ends (the workers decide themselves meanwhile), once it has answered, when it stops
  answering a ping for ``HEALTHCHECK_S`` (a hung process would hold every worker's
  placements), or when it has not answered one ``SCHEDULING_START_S`` after its start
  (hung or stopped while starting; the limit doubles for each such replacement in a row,
  should the machine be that slow), and ended after them, so that their last calls are
  answered.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from loadmaster.scheduler.remote import answers

log = logging.getLogger("loadmaster.api.supervisor")

# A worker that served and then stops answering for this long is replaced. Generous: a
# loaded machine may leave a busy worker's answering thread unscheduled for seconds.
HEALTHCHECK_S = 30
# How often the scheduling process is pinged.
SCHEDULING_CHECK_EVERY_S = 5.0
# How long a starting scheduling process may take to answer its first ping: its imports
# and its first snapshot, which a loaded machine takes seconds to make.
SCHEDULING_START_S = 30.0
# How often a worker still starting is mentioned in the log.
START_NOTE_EVERY_S = 10.0
_PR_SET_PDEATHSIG = 1
# The scheduling process runs as ``python -m`` this module.
SCHEDULING_MODULE = "loadmaster.api.scheduling_process"


def die_with(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` ends; if it already has (its
    SIGKILL came while this process was being spawned), end now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent:
        os._exit(1)


class SchedulingProcess:
    """The scheduling process of the workers, serving in ``directory``, kept alive until
    ``stopping`` is set."""

    def __init__(self, directory: Path, stopping: threading.Event) -> None:
        self.directory = directory
        self.stopping = stopping
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        threading.Thread(target=self._check, name="scheduling-check", daemon=True).start()

    def start(self) -> None:
        # Its own command, not multiprocessing's spawn: ``ps`` (and a test) tells it from
        # the workers by its command line from the moment it starts.
        process = subprocess.Popen(
            [sys.executable, "-m", SCHEDULING_MODULE, str(self.directory), str(os.getpid())]
        )
        log.info("scheduling process [%d] started", process.pid)
        self.started = time.monotonic()
        self.process = process

    def keep_alive(self) -> None:
        """Start a replacement of a process that ended (the supervisor's main loop)."""
        if self.process is None or self.process.poll() is None:
            return
        log.error(
            "scheduling process [%d] ended (exit code %s); workers decide themselves until "
            "its replacement serves",
            self.process.pid,
            self.process.returncode,
        )
        self.start()

    def reload(self) -> None:
        """Pass SIGHUP on: the process reads its policies again."""
        if self.process is not None and self.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGHUP)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()

    def _check(self) -> None:
        """In a thread of its own (a ping waits up to ``HEALTHCHECK_S``): a process that
        has answered once and then stops answering, or that has not answered within its
        start's limit, is killed, and ``keep_alive`` starts its replacement."""
        served: subprocess.Popen[bytes] | None = None
        start_limit = SCHEDULING_START_S
        while not self.stopping.wait(SCHEDULING_CHECK_EVERY_S):
            process, started = self.process, self.started
            if process is None or process.poll() is not None:
                continue
            if answers(self.directory, HEALTHCHECK_S):
                served = process
                start_limit = SCHEDULING_START_S
                continue
            if process.poll() is not None or self.stopping.is_set():
                continue
            if process is served:
                log.error(
                    "scheduling process [%d] did not answer for %d s; replacing it",
                    process.pid,
                    HEALTHCHECK_S,
                )
                process.kill()
            elif time.monotonic() - started > start_limit:
                log.error(
                    "scheduling process [%d] did not start serving within %.0f s; replacing it",
                    process.pid,
                    start_limit,
                )
                start_limit *= 2
                process.kill()
