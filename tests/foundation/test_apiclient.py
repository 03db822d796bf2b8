"""The one HTTP client of the CLI and the agents: one kept-open connection, Retry-After
honoured, server errors as readable messages."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loadmaster.apiclient import ApiClient, ApiError, ApiUnreachable


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.busy_answers = 0  # how many 503s to give before answering
        self.slow_path = ""  # a path answered after a second
        self.seen: list[tuple[str, str, Any, float]] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.seen.append((self.command, self.path, body, time.monotonic()))
        if self.server.slow_path and self.path.startswith(self.server.slow_path):
            time.sleep(1.0)
        if self.server.busy_answers:
            self.server.busy_answers -= 1
            self._answer(503, {"detail": "the store is away"}, {"Retry-After": "0.2"})
        elif self.path.startswith("/missing"):
            self._answer(
                404, {"code": "loadmaster.not_found", "detail": "no VM 'x'", "field": "vm"}
            )
        elif self.path.startswith("/token"):
            self._answer(403, {"code": "loadmaster.forbidden", "detail": "read-only token"})
        else:
            auth = self.headers.get("Authorization")
            self._answer(200, {"path": self.path, "body": body, "auth": auth})

    do_GET = do_POST = do_PUT = do_DELETE = _handle


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_calls_share_one_connection(server: _Server) -> None:
    client = ApiClient(_url(server), "tok")
    answers = [client.get("/vms", state="running", all=True) for _ in range(5)]
    answers.append(client.post("/schedule", {"requests": []}))
    client.close()
    assert server.connections == 1
    assert answers[0] == {"path": "/vms?state=running&all=true", "body": None, "auth": "Bearer tok"}
    assert answers[-1]["body"] == {"requests": []}


def test_a_connection_the_server_closed_is_opened_again(server: _Server) -> None:
    client = ApiClient(_url(server))
    client.get("/a")
    [idle] = client._idle
    assert idle.sock is not None
    idle.sock.close()  # as a server dropping an idle keep-alive connection
    idle.sock = None
    assert client.get("/b")["path"] == "/b"


def test_calls_at_once_do_not_wait_for_each_other(server: _Server) -> None:
    """A slow call in one thread (an agent's long-poll) does not hold up another's."""
    client = ApiClient(_url(server))
    server.slow_path = "/slow"
    slow = threading.Thread(target=client.get, args=("/slow",))
    slow.start()
    time.sleep(0.1)
    started = time.monotonic()
    assert client.get("/quick")["path"] == "/quick"
    assert time.monotonic() - started < 0.5
    slow.join()
    assert len(client._idle) == 2  # both kept for later calls


def test_a_busy_server_is_asked_again_after_its_retry_after(server: _Server) -> None:
    server.busy_answers = 2
    client = ApiClient(_url(server))
    assert client.put("/hosts/h1", {"x": 1})["body"] == {"x": 1}
    times = [t for *_, t in server.seen]
    assert len(times) == 3
    assert all(later - earlier >= 0.18 for earlier, later in itertools.pairwise(times))
    server.busy_answers = 10
    with pytest.raises(ApiError) as err:
        client.get("/still-busy")
    assert err.value.status == 503 and len(server.seen) == 3 + 1 + client.retries


def test_errors_read_as_the_server_wrote_them(server: _Server) -> None:
    client = ApiClient(_url(server))
    with pytest.raises(ApiError) as err:
        client.delete("/missing/x")
    assert (err.value.status, err.value.code, err.value.field) == (
        404,
        "loadmaster.not_found",
        "vm",
    )
    assert str(err.value) == "DELETE /missing/x: 404 no VM 'x'"
    with pytest.raises(ApiError, match=r"refused the token \(GET /token: read-only token\)"):
        client.get("/token")


def test_no_server_is_unreachable_naming_the_address() -> None:
    with pytest.raises(
        ApiUnreachable, match=r"cannot reach the loadmaster API at http://127.0.0.1:9"
    ):
        ApiClient("http://127.0.0.1:9", timeout=2).get("/")
    with pytest.raises(ValueError, match="not an http"):
        ApiClient("ftp://x")


def test_a_closed_client_says_nothing_more(server: _Server) -> None:
    client = ApiClient(_url(server))
    client.get("/a")
    client.close()
    with pytest.raises(ApiUnreachable, match="is closed"):
        client.get("/b")
    assert [path for _, path, *_ in server.seen] == ["/a"]
