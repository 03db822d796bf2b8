"""A real ``loadmaster serve`` process (SQLite, TOML token file) for the CLI tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_helpers import ADMIN, READER, free_port, start_server, stop_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``loadmaster serve`` on SQLite with a TOML token file; yields its URL."""
    directory = tmp_path_factory.mktemp("served")
    tokens = directory / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{ADMIN}" = "admin"\n"{READER}" = "reader"\n')
    port = free_port()
    process = start_server(
        ["--db", f"sqlite:///{directory / 'lm.db'}", "--tokens", str(tokens)], port
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(process)
