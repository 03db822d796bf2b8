"""Nagle's algorithm is off on every connection the API accepts, whichever way its
listener was bound (uvicorn's ``--workers N`` binds it with proto 0, and asyncio then
leaves ``TCP_NODELAY`` off: each keep-alive answer after the first waited ~43 ms for the
client's delayed ACK)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from loadmaster.api.server import NoDelayHTTPProtocol


class _Transport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None


def test_an_accepted_connection_gets_tcp_nodelay(monkeypatch: pytest.MonkeyPatch) -> None:
    handed_on: list[Any] = []
    monkeypatch.setattr(AutoHTTPProtocol, "connection_made", lambda _self, t: handed_on.append(t))
    # As uvicorn's supervisor binds it: proto 0.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()):
            conn, _ = listener.accept()
            with conn:
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
                transport = _Transport(conn)
                NoDelayHTTPProtocol.__new__(NoDelayHTTPProtocol).connection_made(transport)
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
                assert handed_on == [transport]  # uvicorn's own set-up still runs
