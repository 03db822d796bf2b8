"""Route availability and content negotiation, in Placement's order: a path no route
serves, or one its microversion does not have yet, is 404 (and a method the path lacks
405) before anything about the body or ``Accept`` is judged. Then: answers are JSON only,
and a request body must say it is JSON.

- A read whose ``Accept`` admits no JSON gets 406 (a browser's ``*/*`` admits it).
- A body without ``Content-Type`` gets 400, one of another type 415: guessing that an
  unlabelled body is JSON would accept what Placement refuses, and OpenStack's clients
  are tested against Placement.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from loadmaster.api import microversion
from loadmaster.api.errors import (
    JSON,
    NOT_FOUND,
    NotAcceptable,
    error_response,
    media_type_refused,
)
from loadmaster.errors import LoadmasterError, NotFound, ValidationError

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH"})
READ_METHODS = frozenset({"GET", "HEAD"})
# Answers that are not JSON: the Prometheus text format and the interactive docs.
NOT_JSON_PATHS = ("/metrics", "/docs")


def accepts_json(accept: str) -> bool:
    """Whether an ``Accept`` header admits ``application/json`` (q=0 refuses)."""
    for entry in accept.split(","):
        media, *params = (part.strip() for part in entry.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if quality > 0 and media.lower() in ("*/*", "application/*", JSON):
            return True
    return False


class ContentNegotiation:
    """``routes``: every route of the app (included routers are not flattened into the
    app's own list, so they are handed over)."""

    def __init__(self, app: ASGIApp, routes: Sequence[APIRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(NOT_JSON_PATHS):
            await self.app(scope, receive, send)
            return
        route = next((r for r in self.routes if r.matches(scope)[0] is Match.FULL), None)
        if route is None:
            # The router answers 404 or 405 itself.
            await self.app(scope, receive, send)
            return
        error: LoadmasterError | None
        if not microversion.route_available(route.openapi_extra):
            error = NotFound(NOT_FOUND)
        else:
            error = self._refusal(scope["method"], dict(scope["headers"]))
        if error is None:
            await self.app(scope, receive, send)
        else:
            await error_response(error)(scope, receive, send)

    def _refusal(self, method: str, headers: dict[bytes, bytes]) -> LoadmasterError | None:
        accept = headers.get(b"accept")
        if (
            method in READ_METHODS
            and accept is not None
            and accept.strip()
            and not accepts_json(accept.decode("latin-1"))
        ):
            return NotAcceptable(f"Only {JSON} is provided", field="header.accept")
        if method not in WRITE_METHODS:
            return None
        length = headers.get(b"content-length", b"").strip()
        has_body = b"chunked" in headers.get(b"transfer-encoding", b"").lower() or (
            length.isdigit() and int(length) > 0
        )
        content_type = headers.get(b"content-type")
        if content_type is None:
            # A missing body is the route's to judge: some writes take none.
            if has_body:
                return ValidationError("content-type header required", field="header.content-type")
            return None
        media = content_type.decode("latin-1").split(";")[0].strip()
        if media.lower() != JSON:
            return media_type_refused(media)
        return None
