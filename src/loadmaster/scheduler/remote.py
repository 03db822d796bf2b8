"""One scheduling process behind several API workers, as kube-scheduler is one process
behind many API servers.

Each worker of ``serve --workers N`` deciding for itself batched only the calls that
reached that worker, and the workers' claims raced each other for the same hosts' rows:
on PostgreSQL four workers placed 0.55-0.65x of what one did. Here the workers hand every
placement that claims (``Scheduler.schedule`` without ``dry_run``) to one process over a
local socket; its scheduler decides the calls of all workers together (``coalesce.py``),
on one snapshot, and the workers are left with what parallelises: HTTP, validation,
reads, answers.

The socket is the standard library's ``multiprocessing.connection`` over ``AF_UNIX``,
with a key (an HMAC challenge when a connection opens) in a directory only the server's
user can enter. A worker that cannot reach the process (not started yet, ended, being
replaced, or not through the key's challenge within ``HANDSHAKE_S``: stopped, hung)
decides itself, as a single worker does, so placements go on without it; the
database's locks and compare-and-swap keep two deciders correct, as they keep two
schedulers. Only a call the process received and then ended during is not decided again:
whether it claimed is in the VMs' states, and the caller is told so (503).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from loadmaster.errors import LoadmasterError, SchedulerUnavailable

if TYPE_CHECKING:
    from loadmaster.scheduler.core.request import RequestSpec
    from loadmaster.scheduler.core.results import ScheduleResult

log = logging.getLogger("loadmaster.scheduler.remote")

SOCKET_NAME = "socket"
KEY_NAME = "key"
# Connections a worker's threads wait to be accepted on together (one per thread in use).
_BACKLOG = 256
# How long opening a connection (the connect, then each step of the key's challenge) may
# take. The process answers it in milliseconds; one that does not (stopped, hung, its
# socket bound and nobody accepting) held the worker's placement without end.
HANDSHAKE_S = 5.0


class NotReached(Exception):
    """The scheduling process was not asked (nothing listens, or the connection was
    ended before the call went out): the caller decides itself."""


def prepare(directory: Path) -> None:
    """Make ``directory`` (only its owner may enter) and the key the process and the
    workers share; the supervisor does this before starting either."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    key = directory / KEY_NAME
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(os.urandom(32))


class SchedulingClient:
    """A worker's way to the scheduling process: connections kept open between calls,
    one per thread that needs one at a time."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._idle: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        # Whether the last attempt reached the process: each change is logged once.
        self._reached = True

    def schedule(self, requests: Sequence[RequestSpec], **options: Any) -> ScheduleResult:
        """The process's answer to ``Scheduler.schedule(requests, **options)``; raises
        ``NotReached`` when nothing was asked, and what the process's scheduler raised."""
        call = ("schedule", list(requests), options)
        connection = self._send(call)
        try:
            kind, value = connection.recv()
        except (EOFError, OSError) as exc:
            connection.close()
            raise SchedulerUnavailable(
                "the scheduling process ended while deciding this call; whether it claimed "
                "is in each VM's state, and the call may be made again"
            ) from exc
        self._idle.put(connection)
        if kind == "error":
            raise value
        return value

    def _send(self, call: tuple[str, list[RequestSpec], dict[str, Any]]) -> Connection:
        # A kept connection may have been ended by the process since (it was replaced):
        # sending on it fails at once on a local socket, and the next one is tried.
        while True:
            try:
                connection = self._idle.get_nowait()
            except queue.Empty:
                break
            try:
                connection.send(call)
                return connection
            except OSError:
                connection.close()
        try:
            connection = _connect(self._directory)
            connection.send(call)
        except (OSError, EOFError, AuthenticationError) as exc:
            if self._reached:
                log.warning("scheduling process not reached (%s): this worker decides", exc)
                self._reached = False
            raise NotReached(str(exc)) from exc
        if not self._reached:
            log.info("scheduling process reached again: it decides this worker's placements")
            self._reached = True
        return connection

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


def answers(directory: Path, timeout: float) -> bool:
    """Whether the scheduling process answers a ping within ``timeout`` seconds. Asked
    from a thread of its own: each step of the connection has a limit of its own
    (``HANDSHAKE_S``), the whole one is ``timeout``."""
    answered: list[bool] = []

    def ask() -> None:
        with (
            contextlib.suppress(OSError, EOFError, AuthenticationError),
            _connect(directory) as connection,
        ):
            connection.send(("ping", [], {}))
            if connection.poll(timeout):
                answered.append(connection.recv() == ("result", "pong"))

    asking = threading.Thread(target=ask, name="scheduling-ping", daemon=True)
    asking.start()
    asking.join(timeout)
    return bool(answered) and answered[0]


def _connect(directory: Path) -> Connection:
    """A connection to the process listening in ``directory``, past the key's challenge;
    ``OSError`` when the connect or a step of the challenge takes over ``HANDSHAKE_S``."""
    key = (directory / KEY_NAME).read_bytes()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        _limit_waits(sock.fileno(), HANDSHAKE_S)
        sock.connect(str(directory / SOCKET_NAME))
        connection = Connection(sock.detach())
    return _past_challenge(connection, key, answer_first=True)


def _past_challenge(connection: Connection, key: bytes, *, answer_first: bool) -> Connection:
    """``connection`` once both sides proved they hold ``key`` (the client answers the
    challenge first, as ``multiprocessing.connection.Client`` does), each step within
    ``HANDSHAKE_S``; closed, and what failed raised, otherwise."""
    try:
        _limit_waits(connection.fileno(), HANDSHAKE_S)
        if answer_first:
            answer_challenge(connection, key)
            deliver_challenge(connection, key)
        else:
            deliver_challenge(connection, key)
            answer_challenge(connection, key)
        _limit_waits(connection.fileno(), 0.0)  # a call waits as long as its decision takes
    except BaseException:
        connection.close()
        raise
    return connection


def _limit_waits(fd: int, seconds: float) -> None:
    """Sends, receives and a connect on socket ``fd`` fail after ``seconds`` (0: never).
    The kernel's limits, not a socket timeout: ``Connection`` reads the descriptor
    itself, so a timeout must make its read fail, not a poll that it never makes."""
    whole = int(seconds)
    limit = struct.pack("@ll", whole, int((seconds - whole) * 1_000_000))
    sock = socket.socket(fileno=fd)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
    finally:
        sock.detach()  # the descriptor stays its owner's


class Schedules(Protocol):
    """What the server hands its calls to: the scheduling process's ``Scheduler``."""

    @property
    def schedule(self) -> Callable[..., ScheduleResult]: ...


class SchedulingServer:
    """The scheduling process's side: a thread per worker connection, each handing its
    calls to the one scheduler, which decides those that arrive together as one batch."""

    def __init__(self, scheduler: Schedules, directory: Path) -> None:
        self._scheduler = scheduler
        self._path = str(directory / SOCKET_NAME)
        self._key = (directory / KEY_NAME).read_bytes()
        # A socket file left by a process that ended; the supervisor starts one at a time.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)
        # The key's challenge is made in each connection's thread (``_answer``), not in
        # ``accept``: a peer that stalls in it then stalls nobody else.
        self._listener = Listener(self._path, "AF_UNIX", backlog=_BACKLOG)
        self._closing = False
        self._open: set[Connection] = set()
        self._mutex = threading.Lock()

    def serve_forever(self) -> None:
        while True:
            try:
                connection = self._listener.accept()
            except OSError:
                return
            with self._mutex:
                if self._closing:
                    connection.close()
                    return
                self._open.add(connection)
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def close(self) -> None:
        """Stop serving and end every connection, as the process ending would (a server
        in a thread of a longer-lived process: tests)."""
        with self._mutex:
            self._closing = True
            connections = list(self._open)
        # Closing a socket does not wake a thread blocked on it; a last peer wakes accept,
        # a shutdown each reader.
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as peer:
            peer.connect(self._path)
        self._listener.close()
        for connection in connections:
            with contextlib.suppress(OSError):
                peer = socket.socket(fileno=connection.fileno())
                peer.shutdown(socket.SHUT_RDWR)
                peer.detach()  # the connection still owns the descriptor

    def _answer(self, connection: Connection) -> None:
        try:
            _past_challenge(connection, self._key, answer_first=False)
        except (OSError, EOFError, AuthenticationError) as exc:  # closed by then
            log.warning("refused a connection to the scheduling socket: %r", exc)
        else:
            with connection:
                self._serve(connection)
        with self._mutex:
            self._open.discard(connection)

    def _serve(self, connection: Connection) -> None:
        while True:
            try:
                operation, requests, options = connection.recv()
            except (EOFError, OSError):
                return  # the worker closed it, or ended
            if operation == "ping":  # the supervisor's: answered without the scheduler
                connection.send(("result", "pong"))
                continue
            try:
                answer: tuple[str, object] = (
                    "result",
                    self._scheduler.schedule(requests, **options),
                )
            except LoadmasterError as exc:
                answer = ("error", exc)
            except Exception as exc:
                log.exception("scheduling call failed")
                answer = ("error", RuntimeError(f"the scheduling process failed: {exc!r}"))
            try:
                connection.send(answer)
            except OSError:
                return
            except Exception:  # an answer that does not pickle; nothing was sent
                log.exception("scheduling answer could not be sent")
                connection.send(("error", RuntimeError("the scheduling answer was lost")))
