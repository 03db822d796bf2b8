"""A live ``loadmaster serve`` for tests that drive it with OpenStack's own tools (gabbi,
openstackclient, openstacksdk): a fresh SQLite database, a token file, a free port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    tmp: Path, admin_tokens: Sequence[str], other_roles: Mapping[str, str], attempts: int = 3
) -> tuple[subprocess.Popen[bytes], int]:
    """``loadmaster serve`` on a port the OS picked, with ``admin_tokens`` and tokens of
    ``other_roles``; another process may take the port before the server binds it, so a
    server that dies early is started again. Tokens, not ``--no-auth``: OpenStack's tools
    send ``X-Auth-Token``, and Placement's files check that no token gets 401."""
    # A token only this server knows: the readiness probe must reach this server, not
    # another file's that took the same port first (this one then fails to bind).
    probe = uuid.uuid4().hex
    tokens = tmp / "tokens.json"
    roles = {**dict.fromkeys((*admin_tokens, probe), "admin"), **other_roles}
    tokens.write_text(json.dumps({"tokens": roles}))
    log = tmp / "server.log"
    for _ in range(attempts):
        port = free_port()
        with log.open("ab") as out:
            server = subprocess.Popen(
                [
                    str(ROOT / ".venv/bin/loadmaster"),
                    "serve",
                    "--tokens",
                    str(tokens),
                    "--db",
                    f"sqlite:///{tmp / 'placement.db'}",
                    "--port",
                    str(port),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while server.poll() is None and time.monotonic() < deadline:
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{port}/resource_providers",
                    headers={"x-auth-token": probe},
                    timeout=1,
                )
                if answer.status_code == 200:
                    return server, port
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        stop_server(server)
    raise RuntimeError(f"loadmaster serve did not start; see {log}")


def stop_server(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
