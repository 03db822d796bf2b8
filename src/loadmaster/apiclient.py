"""One HTTP client for everything that talks to a loadmaster API: the CLI and host agents.

- Connections kept open between calls (HTTP keep-alive), so a CLI command that makes
  several calls, or an agent reporting every cycle, does not pay a TCP handshake each
  time. Calls from several threads at once each get a connection of their own (an
  agent's long-poll must not hold up its launches' announcements); idle ones are reused.
  A connection the server closed while idle is opened again.
- A 503 (the store away) or 429 is tried again after the ``Retry-After`` the server sends
  (at most 30 s, a few times), stretched by a random fraction of up to a half, so that
  thousands of agents refused together do not come back together: loadmaster answers so
  only when it did not do the work.
- An error answer becomes ``ApiError`` with the server's ``detail``, ``field`` and
  ``code`` and a message a person can act on; no answer at all, ``ApiUnreachable``.
- An ``https://`` API's certificate is verified, against ``ClientTls.ca`` or else the
  system's trust store, and must name the URL's host; an agent may present a client
  certificate (``ClientTls.cert``) naming its host instead of a token.

The standard library's ``http.client``, not httpx: the CLI imports this at every start,
and httpx (with what it pulls in) would double the start-up of every quick command.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from loadmaster.microversions import CLIENT_HEADERS

RETRY_STATUSES = (429, 503)
MAX_RETRY_AFTER_S = 30.0
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class ApiUnreachable(Exception):
    """The API did not answer at all (refused, timed out, name unknown)."""


class ApiError(Exception):
    """The API answered with an error. ``detail``, ``field``, ``code`` and ``body`` are the
    server's; the message says what was refused and why, with ``hint`` when the caller
    knows what to do about it."""

    def __init__(
        self, method: str, path: str, status: int, body: Any, text: str = "", hint: str = ""
    ) -> None:
        self.method, self.path, self.status = method, path, status
        self.body = body if isinstance(body, dict) else {}
        self.detail = str(self.body.get("detail", "")) or text[:200] or f"HTTP {status}"
        self.field = self.body.get("field")
        self.code = str(self.body.get("code", ""))
        if hint:
            message = f"{hint} ({method} {path}: {self.detail})"
        elif status == 401:
            # The server says whether a token was missing or unknown.
            message = f"the loadmaster API refused the request ({method} {path}: {self.detail})"
        elif status == 403:
            message = f"the loadmaster API refused the token ({method} {path}: {self.detail})"
        else:
            message = f"{method} {path}: {status} {self.detail}"
        super().__init__(message)


class TlsSetupError(ValueError):
    """A file ``ClientTls`` names cannot be used; the message names the setting."""


@dataclass(frozen=True)
class ClientTls:
    """How a client speaks TLS to an ``https://`` API: ``ca`` the PEM file of the CA its
    certificate must chain to (None: the system's trust store), ``cert`` and ``key`` a
    client certificate to present (an agent's, naming its host)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def context(self) -> ssl.SSLContext:
        """Raises ``TlsSetupError`` for a file that cannot be read or used."""
        try:
            context = ssl.create_default_context(cafile=self.ca)
        except OSError as exc:
            raise TlsSetupError(f"the CA file {self.ca} (--ca, LOADMASTER_CA): {exc}") from exc
        if self.cert is not None:
            try:
                context.load_cert_chain(self.cert, self.key)
            except OSError as exc:
                raise TlsSetupError(
                    f"the client certificate {self.cert} (--tls-cert, LOADMASTER_TLS_CERT) "
                    f"and its key {self.key or '(in the same file)'} (--tls-key, "
                    f"LOADMASTER_TLS_KEY): {exc}"
                ) from exc
        elif self.key is not None:
            raise TlsSetupError("--tls-key (LOADMASTER_TLS_KEY) needs --tls-cert, its certificate")
        return context


class ApiClient:
    """Calls to the API at ``url`` with ``token``; see the module docstring. Thread-safe."""

    retries = 3

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 60.0,
        tls: ClientTls | None = None,
    ) -> None:
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._parts = parts
        if parts.scheme == "http" and tls is not None and (tls.ca or tls.cert or tls.key):
            raise TlsSetupError(
                f"a CA or client certificate is given (--ca, --tls-cert, --tls-key) but "
                f"{self.url} is plain HTTP: they are for an https:// API"
            )
        # Made once: loading a CA file takes milliseconds, and connections share it.
        self._tls = (tls or ClientTls()).context() if parts.scheme == "https" else None
        self._client_cert = tls.cert if tls is not None and self._tls is not None else None
        self._headers = {"Accept": "application/json", **CLIENT_HEADERS}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._idle: list[http.client.HTTPConnection] = []
        self._busy: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """No call goes out after this; one under way in another thread is cut off (an
        agent killed mid-call says nothing more, as a killed process would)."""
        with self._lock:
            self._closed = True
            every = [*self._idle, *self._busy]
            self._idle.clear()
        for conn in every:
            if conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()

    # -- calls -------------------------------------------------------------------------
    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body=body)

    def put(self, path: str, body: Any = None) -> Any:
        return self.request("PUT", path, body=body)

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, params=params)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """The decoded JSON answer (None for 204, 304 or an empty body); ``params`` whose
        value is None are left out. Raises ``ApiError`` or ``ApiUnreachable``."""
        query = {
            k: str(v).lower() if isinstance(v, bool) else v
            for k, v in (params or {}).items()
            if v is not None
        }
        target = self._parts.path + quote(path, safe="/")
        if query:
            target += "?" + urlencode(query, doseq=True)
        headers = {**self._headers, **(headers or {})}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in range(self.retries + 1):
            status, answer, text, retry_after = self._send(
                method, target, payload, headers, timeout or self.timeout
            )
            if status not in RETRY_STATUSES or attempt == self.retries:
                break
            time.sleep(retry_after * random.uniform(1.0, 1.5))
        if 200 <= status < 300:
            return answer
        if status == 304:  # the caller's copy is current (If-None-Match)
            return None
        raise ApiError(method, path, status, answer, text, self.hint(method, path, status))

    def hint(self, method: str, path: str, status: int) -> str:
        """What a person can do about this error; "" for the plain message."""
        return ""

    # -- the connection ----------------------------------------------------------------
    def _send(
        self,
        method: str,
        target: str,
        payload: bytes | None,
        headers: dict[str, str],
        timeout: float,
    ) -> tuple[int, Any, str, float]:
        for fresh in (False, True):
            conn, reused = self._checkout(timeout, fresh)
            try:
                conn.request(method, target, body=payload, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except _STALE as exc:
                self._checkin(conn, keep=False)
                if reused:
                    continue  # the server closed the idle connection: open a new one
                raise self._unreachable(exc) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._checkin(conn, keep=False)
                raise self._unreachable(exc) from exc
            self._checkin(conn, keep=not response.will_close)
            break
        text = raw.decode(errors="replace")
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:  # not JSON, or not even UTF-8
            answer = None
        return response.status, answer, text, _retry_after(response.getheader("Retry-After"))

    def _checkout(self, timeout: float, fresh: bool) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection (reused: True), or a new one."""
        with self._lock:
            if self._closed:
                raise ApiUnreachable(f"the client of the loadmaster API at {self.url} is closed")
            conn = None if fresh or not self._idle else self._idle.pop()
            if conn is None:
                host, port = self._parts.hostname or "", self._parts.port
                conn = (
                    http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls)
                    if self._tls is not None
                    else http.client.HTTPConnection(host, port, timeout=timeout)
                )
                reused = False
            else:
                reused = True
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
            self._busy.add(conn)
            return conn, reused

    def _checkin(self, conn: http.client.HTTPConnection, *, keep: bool) -> None:
        with self._lock:
            self._busy.discard(conn)
            if keep and not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    def _unreachable(self, exc: BaseException) -> ApiUnreachable:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return ApiUnreachable(
                f"the loadmaster API at {self.url} presented a certificate this client does "
                f"not trust ({exc.verify_message}): --ca (LOADMASTER_CA) must name the CA that "
                f"signed it, and the certificate must be current and name "
                f"{self._parts.hostname}"
            )
        if self._client_cert is not None and isinstance(
            exc, ssl.SSLError | http.client.RemoteDisconnected | ConnectionResetError
        ):
            # Over TLS 1.3 the server judges a client's certificate after the client sent
            # its request: a refusal reads as a connection closed without an answer.
            return ApiUnreachable(
                f"the loadmaster API at {self.url} closed the connection without answering "
                f"({exc}): if it refused this client's certificate {self._client_cert}, that "
                "must be signed by the CA the server was given with --tls-client-ca, and be "
                "current"
            )
        reason = "timed out" if isinstance(exc, socket.timeout | TimeoutError) else exc
        return ApiUnreachable(f"cannot reach the loadmaster API at {self.url}: {reason}")


def _retry_after(value: str | None) -> float:
    try:
        return min(MAX_RETRY_AFTER_S, max(0.1, float(value or "1")))
    except ValueError:
        return 1.0
