"""Real processes for the soak and the crash tests: a private PostgreSQL server and
``loadmaster serve`` with several workers, both on 127.0.0.1 only."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from loadmaster.microversions import CLIENT_HEADERS

ROOT = Path(__file__).resolve().parents[1]
POSTGRES = ["bash", str(ROOT / "scripts/postgres.sh")]


def run_worker(
    script: str,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    label: str = "",
) -> dict[str, Any]:
    """``python script --worker *args`` in a fresh process; the JSON object it prints
    last. A failing worker raises with the end of its stderr."""
    done = subprocess.run(
        [sys.executable, script, "--worker", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{label}worker {args[0]} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def checkout(ref: str, where: Path) -> str:
    """``ref`` checked out into a git worktree at ``where``; the ``PYTHONPATH`` that runs
    it with this virtual environment. The installed package's metadata names this
    checkout's plugins (entry points), which an older build may lack: the build gets a
    metadata directory of its own, from its own pyproject.toml, found first."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref],
        check=True,
        capture_output=True,
    )
    project = tomllib.loads((where / "pyproject.toml").read_text())["project"]
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    meta = where / "bench-metadata" / f"{project['name']}-{project['version']}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    (meta / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
            for group, points in groups.items()
        )
    )
    return f"{where / 'src'}{os.pathsep}{meta.parent}"


def remove_checkout(where: Path) -> None:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
        check=False,
        capture_output=True,
    )


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    load = Path("/proc/loadavg").read_text().split()[:3]
    return f"{model}, {os.cpu_count()} cores, load average {' '.join(load)}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """A throw-away server (``scripts/postgres.sh``) that can be halted and resumed, so a
    test can take the database away from a running service."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="loadmaster-soak-pg-")
        self.url = subprocess.check_output(
            [*POSTGRES, "start", self.directory, str(free_port())], text=True
        ).strip()

    def halt(self) -> None:
        subprocess.run([*POSTGRES, "halt", self.directory], check=True)

    def resume(self) -> None:
        subprocess.run([*POSTGRES, "resume", self.directory], check=True)

    def close(self) -> None:
        subprocess.run([*POSTGRES, "stop", self.directory], check=False)

    def __enter__(self) -> PrivatePostgres:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Until ``condition()`` holds, else an AssertionError naming ``what`` after ``timeout``
    seconds (tests waiting for a server's processes)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)


# ``api.supervisor.SCHEDULING_MODULE``, written out: benchmarks import this module with an
# older build's ``loadmaster`` too (tests/reliability checks the two agree).
SCHEDULING_MODULE = "loadmaster.api.scheduling_process"


class ServedApi:
    """``loadmaster serve --workers N`` as a child process, with one admin token."""

    def __init__(
        self,
        db_url: str,
        workers: int,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        *,
        port: int | None = None,
        token: str | None = None,
        command: Sequence[str] | None = None,
        options: Sequence[str] = (),
        ca: Path | None = None,
    ) -> None:
        """``env``: the server's environment (default: this process's), e.g. another
        build's ``PYTHONPATH``. ``port`` and ``token``: those of a server this one
        replaces (a restart), else new ones. ``command``: what runs ``loadmaster``
        (default: the installed command); ``options``: more options for ``serve``.
        ``ca``: the server serves HTTPS (``options`` give its ``--tls-cert``) with a
        certificate this CA file signed, for 127.0.0.1."""
        self.port = port or free_port()
        self.ca = ca
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        # Hexadecimal: a token starting with "-" would read as an option on a command line.
        self.token = token or secrets.token_hex(24)
        self.workers = workers
        installed = shutil.which("loadmaster", path=str(Path(sys.executable).parent))
        if command is None and installed is None:
            raise RuntimeError("the loadmaster command is not installed next to this Python")
        env = {**(os.environ if env is None else env), "LOADMASTER_TOKENS": f"{self.token}:admin"}
        self._log = open(log_path or os.devnull, "ab")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [
                *(command or [str(installed)]),
                "serve",
                "--db",
                db_url,
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                *options,
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self.wait_ready(workers)
        except RuntimeError as exc:
            self.close()
            tail = Path(log_path).read_text(errors="replace")[-2000:] if log_path else ""
            raise RuntimeError(f"{exc}; the server said:\n{tail}" if tail else str(exc)) from None
        except BaseException:
            self.close()
            raise

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={**CLIENT_HEADERS, "Authorization": f"Bearer {self.token}"},
            timeout=timeout,
            verify=ssl.create_default_context(cafile=self.ca) if self.ca else True,
        )

    def worker_pids(self) -> list[int]:
        """uvicorn's worker processes (children of the supervisor, not its helpers nor
        the scheduling process); with one worker, uvicorn serves from its own process."""
        if self.workers == 1:
            return [self.process.pid]
        return sorted(
            pid
            for pid, cmdline in self._children()
            if b"resource_tracker" not in cmdline and SCHEDULING_MODULE.encode() not in cmdline
        )

    def scheduling_pid(self) -> int | None:
        """The scheduling process the workers hand placements to (several workers only)."""
        found = [pid for pid, cmdline in self._children() if SCHEDULING_MODULE.encode() in cmdline]
        return found[0] if found else None

    def _children(self) -> list[tuple[int, bytes]]:
        """The supervisor's live children: pid, command line."""
        alive = []
        for pid in _children(self.process.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            # A killed process stays a zombie until the supervisor reaps it.
            if status != "Z":
                alive.append((pid, cmdline))
        return alive

    def wait_ready(self, workers: int, timeout: float = 60.0) -> None:
        """Until ``workers`` workers run and one of them answers a database read."""
        deadline = time.monotonic() + timeout
        with self.client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"loadmaster serve exited with {self.process.returncode}")
                try:
                    if (
                        len(self.worker_pids()) >= workers
                        # A read that stays small however many hosts there are.
                        and http.get("/resource_classes/VCPU").status_code == 200
                    ):
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"loadmaster serve was not ready within {timeout:.0f} s")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self) -> ServedApi:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found
