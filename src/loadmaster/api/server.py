"""Serving the API from inside a process (the demo, tests): uvicorn in a thread on a port
the OS hands out, so nothing collides with another server on the machine."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI


@dataclass
class ThreadedServer:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout)


def serve_in_thread(app: FastAPI, *, start_timeout: float = 15.0) -> ThreadedServer:
    """Start ``app`` on 127.0.0.1 in a daemon thread; returns once it accepts requests."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None: the embedding process keeps its own logging set-up.
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, log_config=None)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API server did not start")
        time.sleep(0.01)
    return ThreadedServer(f"http://127.0.0.1:{port}", server, thread)
