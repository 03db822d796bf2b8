"""``loadmaster serve --workers N``: uvicorn's multiprocess supervisor, changed where it
failed under load.

uvicorn pings each worker every half second and kills one that does not answer within
``timeout_worker_healthcheck``, starting a replacement. A worker answers from a thread it
starts only once its spawned interpreter has unpickled its configuration, which imports
the whole API (``NoDelayHTTPProtocol`` lives beside the app): seconds on an idle machine,
far longer on a loaded one. Every worker was then killed before it could answer,
and replaced, every 5 s, with nothing logged. Here:

- a worker that has not yet said it serves is waited for, however long, while it lives;
  its start is logged, and so is a slow start every ``START_NOTE_EVERY_S``;
- only a worker that served and then stops answering is replaced (``HEALTHCHECK_S``);
- a worker dies with its supervisor, SIGKILL included (Linux's ``PR_SET_PDEATHSIG``):
  orphans would keep answering on the port, with whatever tokens they started with;
- ``SIGHUP`` is passed on to each serving worker, which reloads its tokens and its TLS
  certificate in place (``api.reload``); uvicorn replaced every worker instead, ending
  agents' long-polls, and gave up when a replacement took more than 5 s to start.

It also runs the one scheduling process the workers hand their placements to
(``api.scheduling_process``): started before them, replaced when it ends (the workers
decide themselves meanwhile), once it has answered, when it stops answering a ping for
``HEALTHCHECK_S`` (a hung process would hold every worker's placements), or when it has
not answered one ``SCHEDULING_START_S`` after its start (hung or stopped while
starting; the limit doubles for each such replacement in a row, should the machine be
that slow), and ended after them, so that their last calls are answered.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from socket import socket

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.server import Server
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from loadmaster.api.server import StoppingServer
from loadmaster.scheduler.remote import answers, prepare
from loadmaster.settings import env_name

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


class Worker(Process):
    """One worker process, as the supervisor sees it."""

    def __init__(self, config: Config, sockets: list[socket]) -> None:
        super().__init__(config, sockets)
        self.supervisor = os.getpid()
        self.started_at = time.monotonic()
        self.serving = False
        # A SIGHUP that came while the worker was starting, passed on once it serves.
        self.reload_pending = False
        self._next_note = START_NOTE_EVERY_S
        self._asked = False

    def target(self, sockets: list[socket] | None = None) -> None:  # pragma: no cover
        """Runs in the worker process."""
        die_with(self.supervisor)
        # Until the app's lifespan takes SIGHUP as a reload, one must not end the worker.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        # uvicorn's answering thread and this one would each create the Server on first
        # use; one made here first is the one both see.
        _ = self.server
        super().target(sockets)

    @property
    def server(self) -> Server:
        if self._server is None:
            self._server = StoppingServer(config=self.config)
        return self._server

    def says_it_serves(self) -> bool:
        """Whether the worker has answered that it serves, without waiting: one question
        is outstanding at a time, so answers never pile up behind a slow start."""
        try:
            if not self._asked:
                self.parent_conn.send(b"ping")
                self._asked = True
            if self.parent_conn.poll(0):
                self._asked = False
                self.serving = bool(self.parent_conn.recv())
        except (OSError, EOFError, pickle.UnpicklingError):
            return False
        return self.serving

    def note_slow_start(self) -> None:
        waited = time.monotonic() - self.started_at
        if waited >= self._next_note:
            log.warning(
                "worker [%d] still starting after %.0f s (a loaded machine imports "
                "slowly); waiting for it",
                self.pid,
                waited,
            )
            self._next_note += START_NOTE_EVERY_S


class Supervisor(Multiprocess):
    # Every process this supervisor starts is a Worker (its own ``_start_worker``).
    processes: list[Worker]  # type: ignore[assignment]

    def __init__(self, config: Config, sockets: list[socket], scheduling: Path) -> None:
        super().__init__(config, sockets)
        self.scheduling_dir = scheduling
        self.scheduling: subprocess.Popen[bytes] | None = None
        self.scheduling_started = 0.0
        threading.Thread(
            target=self._check_scheduling, name="scheduling-check", daemon=True
        ).start()

    def _start_scheduling(self) -> None:
        # Its own command, not multiprocessing's spawn: ``ps`` (and a test) tells it from
        # the workers by its command line from the moment it starts.
        process = subprocess.Popen(
            [sys.executable, "-m", SCHEDULING_MODULE, str(self.scheduling_dir), str(os.getpid())]
        )
        log.info("scheduling process [%d] started", process.pid)
        self.scheduling_started = time.monotonic()
        self.scheduling = process

    def _keep_scheduling_alive(self) -> None:
        if self.scheduling is None or self.scheduling.poll() is None:
            return
        log.error(
            "scheduling process [%d] ended (exit code %s); workers decide themselves until "
            "its replacement serves",
            self.scheduling.pid,
            self.scheduling.returncode,
        )
        self._start_scheduling()

    def _check_scheduling(self) -> None:
        """In a thread of its own (a ping waits up to ``HEALTHCHECK_S``): a scheduling
        process that has answered once and then stops answering, or that has not answered
        within its start's limit, is killed, and the main loop starts its replacement."""
        served: subprocess.Popen[bytes] | None = None
        start_limit = SCHEDULING_START_S
        while not self.should_exit.wait(SCHEDULING_CHECK_EVERY_S):
            process, started = self.scheduling, self.scheduling_started
            if process is None or process.poll() is not None:
                continue
            if answers(self.scheduling_dir, HEALTHCHECK_S):
                served = process
                start_limit = SCHEDULING_START_S
                continue
            if process.poll() is not None or self.should_exit.is_set():
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

    def join_all(self) -> None:
        super().join_all()
        # Only now: a worker finishing its last requests may still be waiting on it.
        if self.scheduling is not None:
            self.scheduling.terminate()
            self.scheduling.wait()

    def _start_worker(self) -> Worker:
        worker = Worker(self.config, self.sockets)
        worker.start()
        return worker

    def init_processes(self) -> None:
        self._start_scheduling()
        self.processes = [self._start_worker() for _ in range(self.processes_num)]

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        self._keep_scheduling_alive()
        for idx, worker in enumerate(self.processes):
            if worker.process.is_alive():
                if not worker.serving:
                    self._watch_start(worker)
                    continue
                if worker.ping(self.config.timeout_worker_healthcheck):
                    continue
                log.error(
                    "worker [%d] did not answer its health check within %d s; replacing it",
                    worker.pid,
                    self.config.timeout_worker_healthcheck,
                )
            worker.kill()
            worker.join()
            if worker.exitcode == STARTUP_FAILURE:
                # The app, its settings or the socket are broken: every start would fail.
                log.error("worker [%d] failed to start; stopping the server", worker.pid)
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            log.warning(
                "worker [%d] ended (exit code %s); starting another", worker.pid, worker.exitcode
            )
            self.processes[idx] = self._start_worker()

    def _watch_start(self, worker: Worker) -> None:
        if not worker.says_it_serves():
            worker.note_slow_start()
            return
        log.info(
            "worker [%d] serving, %.1f s after it was started",
            worker.pid,
            time.monotonic() - worker.started_at,
        )
        if worker.reload_pending:
            self._reload(worker)
        if all(w.serving for w in self.processes):
            log.info("all %d workers serving", len(self.processes))

    def handle_hup(self) -> None:
        log.info(
            "SIGHUP: each worker reloads its tokens and certificate, the scheduling process "
            "its policies"
        )
        if self.scheduling is not None and self.scheduling.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.scheduling.pid, signal.SIGHUP)
        for worker in self.processes:
            if worker.serving:
                self._reload(worker)
            else:
                worker.reload_pending = True

    def _reload(self, worker: Worker) -> None:
        worker.reload_pending = False
        if worker.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # died: its replacement reads anew
                os.kill(worker.pid, signal.SIGHUP)

    def handle_ttin(self) -> None:
        log.info("SIGTTIN: one more worker")
        self.processes_num += 1
        self.processes.append(self._start_worker())


def run_server(config: Config) -> None:
    """``uvicorn.run`` with ``config``, several workers under loadmaster's supervisor."""
    if config.workers > 1:
        scheduling = Path(tempfile.mkdtemp(prefix="loadmaster-scheduling-"))
        try:
            prepare(scheduling)
            # Read by the workers' settings (they are spawned after this).
            os.environ[env_name("scheduling_dir")] = str(scheduling)
            Supervisor(config, [config.bind_socket()], scheduling).run()
        finally:
            shutil.rmtree(scheduling, ignore_errors=True)
        return
    # Until the app's lifespan takes SIGHUP as a reload (api.reload), one must not end it.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    server = StoppingServer(config)
    server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
