"""Agents' long-polls of ``GET /hosts/{host}/work?wait=S`` are held here, in front of
every middleware, and only then go down the stack to be answered.

A waiting request held inside the stack kept a coroutine frame, closures and a wrapped
``send`` per middleware alive for its whole wait: about 140 objects the garbage
collector tracks per request, millions at 10,000 waiting agents, so that each full
collection paused the server for a long while (docs/architecture.md), delaying
wake-ups and placements alike. Held here, a wait is one coroutine, a future in the
process's ``HostWatch`` and a task listening for the client hanging up. When the host
may have changed, or the wait ran out, the request continues down the stack with
``wait=0``: authentication, validation, the work list or its 304, logging and metrics
are the stack's, once, as for any request.

Only requests the stack would let wait are held (a known token that may read the host's
list, a version header that parses, an ``Accept`` that admits JSON, a query of nothing
but well-formed ``after`` and ``wait``, no NUL, an agent's run well formed if said, a
root host that exists); anything else
goes down at once and gets the stack's answer (401, 400, 404, 406), not that answer a
whole wait later.
"""

from __future__ import annotations

import math
import re
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loadmaster.api import microversion
from loadmaster.api.auth import AGENT_PREFIX, TokenTable, request_role
from loadmaster.api.negotiation import refusal
from loadmaster.errors import LoadmasterError
from loadmaster.heartbeat import AGENT_HEADER, AGENT_RUN_HEADER, polls_as_agent, valid_run
from loadmaster.hostcontrol import HostWatch

# The longest wait an agent may ask (Nomad's blocking queries: 10 minutes); the shipped
# agent asks up to 110 s (``manager.DEFAULT_WAIT_S``), which proxies must let idle.
MAX_WAIT_S = 600.0
# ``after``'s range: a generation already seen (-1: none).
MAX_AFTER = 2**62

_WORK = re.compile(r"/hosts/(?P<host>[^/]+)/work")
# The work route's query parameters: the stack refuses any other (``no_unknown_query``).
PARAMETERS = frozenset({"after", "wait"})


class HeldPolls:
    """The outermost ASGI layer: holds long-polls of work lists until worth answering."""

    def __init__(self, app: ASGIApp, watch: HostWatch, tokens: TokenTable | None) -> None:
        self.app = app
        self.watch = watch
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        held = self._holdable(scope)
        if held is None:
            await self.app(scope, receive, send)
            return
        ident, after, wait, bound, query = held
        try:
            host = await self.watch.host(ident)
        except Exception:  # no such host, a child, the database away: the stack says so
            await self.app(scope, receive, send)
            return
        agent = polls_as_agent(bound, host.name, _header(scope, AGENT_HEADER))
        replay = _Replay(receive)
        if agent:
            self.watch.heard(host.id)
        woke = await self.watch.hold(host.id, after, wait, replay.hung_up, agent=agent)
        if woke == "gone":
            # The client hung up: nobody reads an answer (uvicorn sends none for a
            # request whose connection is gone).
            return
        now = urlencode([*((k, v) for k, v in query if k != "wait"), ("wait", "0")])
        await self.app({**scope, "query_string": now.encode()}, replay.receive, send)

    def _holdable(
        self, scope: Scope
    ) -> tuple[str, int, float, str | None, list[tuple[str, str]]] | None:
        """(host, after, wait, the host the token is bound to, the query's pairs) of a
        request to hold."""
        if scope["type"] != "http" or scope["method"] != "GET":
            return None
        match = _WORK.fullmatch(scope["path"])
        if match is None or "\x00" in scope["path"]:
            return None
        try:
            query = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            given = dict(query)
            after = int(given.get("after", "-1"))
            wait = float(given.get("wait", "0"))
            microversion.requested(scope)
        except (ValueError, LoadmasterError):
            return None
        if not given.keys() <= PARAMETERS or any("\x00" in v for v in given.values()):
            return None
        if refusal(scope["method"], dict(scope["headers"])) is not None:
            return None
        run = _header(scope, AGENT_RUN_HEADER)
        if run is not None and not valid_run(run):
            return None
        if not (-1 <= after <= MAX_AFTER and 0 < wait <= MAX_WAIT_S and math.isfinite(wait)):
            return None
        bound: str | None = None
        if self.tokens is not None:
            role = request_role(scope, self.tokens)
            if role is None or role == "member":
                return None
            if role.startswith(AGENT_PREFIX):
                bound = role[len(AGENT_PREFIX) :]
            elif role != "admin":
                bound = ""  # a reader may watch a list; it is no host's agent
        return match.group("host"), after, wait, bound, query


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.lower().encode("latin-1")
    for key, value in scope["headers"]:
        if key == wanted:
            return bytes(value).decode("latin-1")
    return None


class _Replay:
    """The request's ``receive``, listened to for the client hanging up while held; the
    request's own (empty) body, read meanwhile, is handed to the stack afterwards."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._read: list[Message] = []

    async def hung_up(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                return
            self._read.append(message)

    async def receive(self) -> Message:
        if self._read:
            return self._read.pop(0)
        return await self._receive()
