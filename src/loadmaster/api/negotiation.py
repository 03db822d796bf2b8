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

import html
import json
from collections.abc import Sequence
from http import HTTPStatus

from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loadmaster.api import microversion
from loadmaster.api.errors import (
    JSON,
    NOT_FOUND,
    MethodNotAllowed,
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


def refusal(method: str, headers: dict[bytes, bytes]) -> LoadmasterError | None:
    """Why a request to an available route is refused for its media types, if it is:
    an ``Accept`` without JSON on a read, a body that is not JSON on a write."""
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
        headers: dict[str, str] = {}
        if not microversion.route_available(route.openapi_extra):
            # A method the path gains later is 405 where the path already has others at
            # this version (as Placement's method map answers), else the path is 404.
            allowed = self._methods_available(scope)
            if allowed:
                headers["Allow"] = ", ".join(sorted(allowed))
                error = MethodNotAllowed(
                    f"The method {scope['method']} is not allowed for this resource."
                )
            else:
                error = NotFound(NOT_FOUND)
        else:
            error = refusal(scope["method"], dict(scope["headers"]))
        if error is None:
            await self.app(scope, receive, send)
        else:
            await error_response(error, headers)(scope, receive, send)

    def _methods_available(self, scope: Scope) -> set[str]:
        return {
            method
            for route in self.routes
            if route.matches(scope)[0] is Match.PARTIAL
            and microversion.route_available(route.openapi_extra)
            for method in route.methods or ()
        }


class HtmlErrors:
    """An error answered to a client that accepts HTML and not JSON (a browser) is a
    small HTML page, as Placement's (webob's) errors are; every other answer stays JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        accept = dict(scope.get("headers", [])).get(b"accept", b"").decode("latin-1")
        if scope["type"] != "http" or "text/html" not in accept.lower() or accepts_json(accept):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body = b""

        async def as_html(message: Message) -> None:
            nonlocal start, body
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None:
                await send(message)
                return
            body += message.get("body", b"")
            if message.get("more_body"):
                return
            page = _html_page(start["status"], body)
            headers = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in (b"content-type", b"content-length")
            ]
            headers += [
                (b"content-type", b"text/html; charset=UTF-8"),
                (b"content-length", str(len(page)).encode()),
            ]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": page})

        await self.app(scope, receive, as_html)


def _html_page(status: int, body: bytes) -> bytes:
    try:
        detail = str(json.loads(body).get("detail", ""))
    except (ValueError, AttributeError):
        detail = body.decode("utf-8", "replace")
    title = f"{status} {HTTPStatus(status).phrase}"
    return (
        f"<html><head><title>{title}</title></head><body><h1>{title}</h1>"
        f"{html.escape(detail)}</body></html>"
    ).encode()
