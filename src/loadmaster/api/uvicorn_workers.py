"""The overrides of uvicorn's multiprocess supervisor (``uvicorn.supervisors.multiprocess``)
that ``serve --workers N`` runs, all in this module: they rely on that module's internals
as of ``PINNED_UVICORN`` (its methods' names and what its main loop calls when), which a
test pins: another uvicorn fails it, by name, until these are read again against it.

uvicorn pings each worker every half second and kills one that does not answer within
``timeout_worker_healthcheck``, starting a replacement. A worker answers from a thread it
starts only once its spawned interpreter has unpickled its configuration, which imports
the whole API (``NoDelayHTTPProtocol`` lives beside the app): seconds on an idle machine,
many more on a loaded one. Every worker was then killed before it could answer, and
replaced, again and again, with nothing logged. Here:

- a worker that has not yet said it serves is waited for, however long, while it lives;
  its start is logged, and so is a slow start every ``START_NOTE_EVERY_S``;
- only a worker that served and then stops answering is replaced (``HEALTHCHECK_S``);
- each worker dies with the supervisor (``supervisor.die_with``);
- ``SIGHUP`` is passed on to each serving worker, which reloads its tokens and its TLS
  certificate in place (``api.reload``); uvicorn replaced every worker instead, ending
  agents' long-polls, and gave up when a replacement was slow to start;
- the scheduling process (``supervisor.SchedulingProcess``) is started before the
  workers, kept alive by the main loop, told of SIGHUP, and ended after the workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from socket import socket

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.server import Server
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from loadmaster.api.server import StoppingServer
from loadmaster.api.supervisor import START_NOTE_EVERY_S, SchedulingProcess, die_with
from loadmaster.scheduler.remote import prepare
from loadmaster.settings import env_name

# The uvicorn these overrides were written against (pyproject.toml pins it).
PINNED_UVICORN = "0.54.0"

log = logging.getLogger("loadmaster.api.supervisor")


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
        self.scheduling = SchedulingProcess(scheduling, self.should_exit)

    def join_all(self) -> None:
        super().join_all()
        # Only now: a worker finishing its last requests may still be waiting on it.
        self.scheduling.stop()

    def _start_worker(self) -> Worker:
        worker = Worker(self.config, self.sockets)
        worker.start()
        return worker

    def init_processes(self) -> None:
        self.scheduling.start()
        self.processes = [self._start_worker() for _ in range(self.processes_num)]

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        self.scheduling.keep_alive()
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
        self.scheduling.reload()
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
