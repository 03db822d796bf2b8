"""A real uvicorn server on 127.0.0.1 (random free port) in a thread, over the test's
database, with httpx clients for each role."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from api_helpers import Live, run_server

import loadmaster
from loadmaster.api import AuthConfig, create_app
from loadmaster.microversions import CLIENT_HEADERS

ADMIN = "admin-5f1c0e1d9a"
READER = "reader-77b2a4c3e0"
MEMBER = "member-0c5e9d21ab"


@pytest.fixture
def live(db_url: str) -> Iterator[Live]:
    lm = loadmaster.open(db_url)
    app = create_app(lm, AuthConfig({ADMIN: "admin", READER: "reader", MEMBER: "member"}))
    server, thread, url = run_server(app)
    clients = [
        httpx.Client(
            base_url=url, headers={**CLIENT_HEADERS, "Authorization": f"Bearer {token}"}, timeout=30
        )
        for token in (ADMIN, READER, MEMBER)
    ]
    anonymous = httpx.Client(base_url=url, headers=CLIENT_HEADERS, timeout=30)
    try:
        yield Live(url, lm, clients[0], clients[1], anonymous, clients[2])
    finally:
        for client in (*clients, anonymous):
            client.close()
        server.should_exit = True
        thread.join(timeout=10)
        lm.close()
