"""Running ``loadmaster serve`` and the CLI itself as real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
LOADMASTER = str(Path(sys.executable).parent / "loadmaster")
ADMIN = "cli-admin-token"
READER = "cli-reader-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(args: list[str], port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [LOADMASTER, "serve", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "LOADMASTER_TOKENS": ""},
    )
    return wait_until_healthy(process, port)


def wait_until_healthy(
    process: subprocess.Popen[str], port: int | str, *, https: bool = False
) -> subprocess.Popen[str]:
    """``process`` once its server answers /healthz; killed if it never does. ``https``:
    it serves HTTPS, whose certificate is the caller's to check."""
    deadline = time.monotonic() + 60
    url = f"{'https' if https else 'http'}://127.0.0.1:{port}/healthz"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {process.stdout.read() if process.stdout else ''}")
        try:
            if httpx.get(url, timeout=1, verify=not https).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
    stop_server(process)
    raise RuntimeError("server did not answer /healthz")


def stop_server(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_cli(
    *args: str,
    url: str | None = None,
    token: str | None = ADMIN,
    settings: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """The real entry point in a new process, with none of this process's LOADMASTER_
    variables but ``settings``, ``url`` and ``token``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADMASTER_")}
    env.update(settings or {})
    if url is not None:
        env["LOADMASTER_URL"] = url
    if token is not None:
        env["LOADMASTER_TOKEN"] = token
    return subprocess.run(
        [LOADMASTER, *args], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT
    )
