"""Serving the API from inside a process (the demo, tests): uvicorn in a thread on a port
the OS hands out, so nothing collides with another server on the machine."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from loadmaster.api.tls import CLIENT_HOST, peer_host


class NoDelayHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP protocol with Nagle's algorithm off on every connection.

    asyncio turns ``TCP_NODELAY`` on only for accepted sockets whose listener was made with
    ``proto=IPPROTO_TCP``; uvicorn's ``--workers N`` supervisor binds its listener with
    proto 0 (uvicorn issue #3149). The second write of an answer then waited for the
    client's delayed ACK: about 43 ms on every keep-alive request after the first
    (measured: ``GET /healthz`` 44 ms with 4 workers, 1 ms with 1).

    Over TLS it also hands the host a verified client certificate names to each request
    of the connection (``api.tls``): uvicorn copies ``app_state`` into every request's
    ``state``, so the connection's own copy carries it."""

    app_state: dict[str, Any]  # uvicorn's (lifespan state), set in its __init__

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_probing(sock)
        # asyncio makes the connection only once the TLS handshake is done.
        tls = transport.get_extra_info("ssl_object")
        host = peer_host(tls.getpeercert()) if tls is not None else None
        if host is not None:
            self.app_state = {**self.app_state, CLIENT_HOST: host}
        super().connection_made(transport)


# An agent's long-poll held open counts as hearing from it (``HostWatch``): the kernel's
# keep-alive probes end the connection of a peer that died without closing it (a host
# powered off), within KEEPIDLE + KEEPINTVL * KEEPCNT = 25 s, at no cost to the server.
KEEPIDLE_S, KEEPINTVL_S, KEEPCNT = 10, 5, 3
# How long a stopping server lets requests finish; a long-poll still held then is ended
# (its agent reconnects to whichever server answers next).
GRACEFUL_SHUTDOWN_S = 3


# As many connections as the kernel lets one listener queue (net.core.somaxconn caps it).
LISTEN_BACKLOG = 4096
# Where the app's lifespan leaves what ends its held long-polls (``HostWatch.release``).
RELEASE_POLLS = "loadmaster.release_polls"


class StoppingServer(uvicorn.Server):
    """uvicorn's server, which tells the app as it starts to stop, before it waits for
    the requests in flight: the agents' long-polls the app holds are answered at once
    (their lists, or 304). Else each was held until the graceful shutdown's time ran
    out, then cancelled: a ``CancelledError`` traceback in the log, and a 500 or a cut
    connection for the agent."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        release = self.lifespan.state.get(RELEASE_POLLS)
        if callable(release):
            release()
        await super().shutdown(sockets)


def raise_open_files_limit() -> int:
    """Each waiting agent holds a connection, and so a file descriptor: the soft limit
    (often 1,024) goes up to the hard one. Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def keep_probing(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPIDLE_S),
        ("TCP_KEEPINTVL", KEEPINTVL_S),
        ("TCP_KEEPCNT", KEEPCNT),
    ):
        if hasattr(socket, option):  # Linux names; other kernels keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def run_server(config: uvicorn.Config) -> None:
    """``uvicorn.run`` with ``config``, several workers under loadmaster's supervisor
    (``api.uvicorn_workers``)."""
    if config.workers > 1:
        from loadmaster.api.uvicorn_workers import Supervisor
        from loadmaster.scheduler.remote import prepare
        from loadmaster.settings import env_name

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


@dataclass
class ThreadedServer:
    url: str
    server: StoppingServer
    thread: threading.Thread

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout)


def serve_in_thread(app: FastAPI, *, start_timeout: float = 15.0) -> ThreadedServer:
    """Start ``app`` on 127.0.0.1 in a daemon thread; returns once it accepts requests."""
    # proto=IPPROTO_TCP: only then does asyncio turn Nagle off on accepted connections.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None: the embedding process keeps its own logging set-up.
    server = StoppingServer(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            log_config=None,
            http=NoDelayHTTPProtocol,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API server did not start")
        time.sleep(0.01)
    return ThreadedServer(f"http://127.0.0.1:{port}", server, thread)
