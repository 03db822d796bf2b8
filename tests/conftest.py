"""Databases for tests: a fresh SQLite file, or a fresh database on a real PostgreSQL server.

scripts/test.sh starts PostgreSQL and exports LOADMASTER_TEST_PG_URL; when it is not set
(a developer running pytest directly) this starts a private server for the session.
Each test gets its own database, copied from a migrated template, so tests never see
each other's rows.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

import loadmaster
from loadmaster.service import Loadmaster
from process_guard import install, no_process_outlives_its_test

ROOT = Path(__file__).resolve().parents[1]
# Every test: no process it started may outlive it (process_guard.py).
__all__ = ["no_process_outlives_its_test"]
_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    install(config)


def free_port() -> int:
    """A TCP port the OS hands out now (bind to port 0): unlike one derived from the
    process id, it is free on a busy machine. Another process could take it before
    PostgreSQL binds it, so the caller retries on a failed start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_postgres(pgdir: str, attempts: int = 3) -> str:
    """Start a throw-away server on a port the OS picked; its URL."""
    for attempt in range(attempts):
        try:
            return subprocess.check_output(
                ["bash", str(ROOT / "scripts/postgres.sh"), "start", pgdir, str(free_port())],
                text=True,
            ).strip()
        except subprocess.CalledProcessError:
            subprocess.run(["bash", str(ROOT / "scripts/postgres.sh"), "stop", pgdir], check=False)
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    url = os.environ.get("LOADMASTER_TEST_PG_URL")
    if url:
        yield url
        return
    pgdir = tempfile.mkdtemp(prefix="loadmaster-pg-")
    url = start_postgres(pgdir)
    try:
        yield url
    finally:
        subprocess.run(["bash", str(ROOT / "scripts/postgres.sh"), "stop", pgdir], check=False)


def _with_database(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> str:
    """A migrated database to copy; building it once saves a migration per test."""
    name = f"lm_template_{_worker()}"
    admin = create_engine(pg_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        conn.execute(text(f"CREATE DATABASE {name}"))
    lm = loadmaster.open(_with_database(pg_server, name))
    lm.close()
    admin.dispose()
    return name


def new_pg_database(pg_server: str, template: str) -> str:
    name = f"lm_{_worker()}_{os.getpid()}_{next(_counter)}"
    admin = create_engine(pg_server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE {template}"))
    admin.dispose()
    return _with_database(pg_server, name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of an empty, migrated database, once on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'loadmaster.db'}"
    server = request.getfixturevalue("pg_server")
    return new_pg_database(server, request.getfixturevalue("pg_template"))


@pytest.fixture
def pg_url(pg_server: str, pg_template: str) -> str:
    """A fresh PostgreSQL database only (for multi-process tests)."""
    return new_pg_database(pg_server, pg_template)


@pytest.fixture
def lm(db_url: str) -> Iterator[Loadmaster]:
    service = loadmaster.open(db_url)
    try:
        yield service
    finally:
        service.close()
