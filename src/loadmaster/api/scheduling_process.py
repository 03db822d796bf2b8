"""The scheduling process of ``serve --workers N``: one scheduler deciding the placements
of every worker (``scheduler/remote.py`` says why). The supervisor starts it before the
workers, replaces it if it ends, and passes ``SIGHUP`` on to it as to them (it reads the
policies file again)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

from loadmaster.api.observability import configure_logging
from loadmaster.api.reload import reload_policies
from loadmaster.api.supervisor import die_with
from loadmaster.runtime import settle_heap
from loadmaster.scheduler.remote import SchedulingServer
from loadmaster.service import scheduler_for
from loadmaster.settings_model import load_settings
from loadmaster.store import Store

log = logging.getLogger("loadmaster.api.scheduling_process")


def run(directory: str, supervisor: int) -> None:  # pragma: no cover - its own process
    die_with(supervisor)
    # Ctrl-C reaches the whole process group; the supervisor ends this process itself,
    # after its workers. A SIGHUP before the handler below is set must not end it either.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    configure_logging()
    settings = load_settings()
    store = Store(settings.db, fast_statements=settings.fast_statements)
    scheduler = scheduler_for(store, settings)

    def reload(*_: object) -> None:
        # Not in the handler itself: reading the file may take a while.
        threading.Thread(target=reload_policies, args=(scheduler, settings)).start()

    signal.signal(signal.SIGHUP, reload)
    scheduler.refresh()  # the first call should not pay the whole load
    settle_heap()
    # Only now, ready to answer: a socket listening before would have held the workers'
    # calls through the whole load instead of letting them decide themselves meanwhile.
    server = SchedulingServer(scheduler, Path(directory))
    log.info("scheduling process serving on %s", directory)
    server.serve_forever()


if __name__ == "__main__":  # pragma: no cover - started by the supervisor
    run(sys.argv[1], int(sys.argv[2]))
