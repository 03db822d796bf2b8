"""Placement's microversions: ``OpenStack-API-Version: placement X.Y`` picks how a request is
answered, and every answer says which version it was answered at.

No header means the minimum version (1.0), as in Placement, so an OpenStack client that
sends none gets 1.0 answers; ``latest`` means the maximum. A version that is not ``X.Y`` is
refused with 400, one outside ``[MIN, MAX]`` with 406. The version chosen is kept in a
context variable for the rest of the request: routes and the error renderer read it
with ``current()``.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import format_datetime

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loadmaster.errors import LoadmasterError
from loadmaster.microversions import HEADER as _HEADER
from loadmaster.microversions import MAX, MIN, SERVICE_TYPE, Version

__all__ = ["MAX", "MIN", "Version", "current", "parse"]

HEADER = _HEADER.lower()  # ASGI header names are lower case
CACHE_HEADERS_SINCE = (1, 15)
# A route's ``openapi_extra`` key for the first microversion that has it.
SINCE_KEY = "x-placement-since"

_current: contextvars.ContextVar[Version] = contextvars.ContextVar(
    "placement_microversion", default=MIN
)
_VERSION = re.compile(r"^([1-9]\d*|0)\.([1-9]\d*|0)$")


class BadVersion(LoadmasterError):
    code = "loadmaster.bad_microversion"
    title = "Invalid microversion"


class UnacceptableVersion(LoadmasterError):
    code = "loadmaster.unacceptable_microversion"
    title = "Unsupported microversion"


def current() -> Version:
    return _current.get()


def since(major: int, minor: int) -> dict[str, str]:
    """A route's ``openapi_extra`` for a route Placement added in ``major.minor``: below it
    the route answers 404, as if it were not there (it is also shown in the API document)."""
    return {SINCE_KEY: str(Version(major, minor))}


def route_available(openapi_extra: Mapping[str, object] | None) -> bool:
    wanted = str((openapi_extra or {}).get(SINCE_KEY, MIN))
    major, _, minor = wanted.partition(".")
    return current() >= Version(int(major), int(minor))


def parse(header: str | None) -> Version:
    """The version a request asks for. The header may name several services
    (``compute 2.1, placement 1.5``); only Placement's entry counts."""
    if header is None:
        return MIN
    wanted = None
    for entry in header.split(","):
        service, _, value = entry.strip().partition(" ")
        if service.lower() == SERVICE_TYPE:
            wanted = value.strip()
    if wanted is None:
        return MIN
    if wanted.lower() == "latest":
        return MAX
    match = _VERSION.match(wanted)
    if match is None:
        raise BadVersion(f"invalid version string: {wanted}", field="header.openstack-api-version")
    version = Version(int(match.group(1)), int(match.group(2)))
    if not MIN <= version <= MAX:
        raise UnacceptableVersion(
            f"Unacceptable version header: {wanted}", field="header.openstack-api-version"
        )
    return version


_HEADER_BYTES = HEADER.encode()


def requested(scope: Scope) -> Version:
    """The version the request's headers ask for (``parse`` of them all together)."""
    raw = [v.decode("latin-1") for k, v in scope["headers"] if k == _HEADER_BYTES]
    return parse(", ".join(raw) if raw else None)


def use(version: Version) -> contextvars.Token[Version]:
    """Answer the rest of this request at ``version`` (``current()``)."""
    return _current.set(version)


def done(token: contextvars.Token[Version]) -> None:
    _current.reset(token)


Render = Callable[[LoadmasterError, Mapping[str, str]], Response]


class MicroversionMiddleware:
    """Parses the header, refuses bad versions and labels every answer with the version
    (``vary`` tells caches the answer depends on it). ``render`` answers a refused one in
    the API's error shape."""

    def __init__(self, app: ASGIApp, render: Render) -> None:
        self.app = app
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            version = requested(scope)
        except (BadVersion, UnacceptableVersion) as exc:
            await self.render(exc, _headers(MIN))(scope, receive, send)
            return
        token = _current.set(version)

        method = scope["method"]

        async def labelled(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *message.get("headers", []),
                    *labels(version, method, message["status"]),
                ]
            await send(message)

        try:
            await self.app(scope, receive, labelled)
        finally:
            _current.reset(token)


def labels(version: Version, method: str, status: int) -> list[tuple[bytes, bytes]]:
    """The headers an answer at ``version`` carries: the version, ``vary`` and, from 1.15,
    Placement's cache headers where it sends them: on reads, and on writes that answer 200
    with the written resource (not 201 or 204)."""
    added = _headers(version)
    if version.matches(*CACHE_HEADERS_SINCE) and (
        status == 200 or (method == "GET" and 200 <= status < 300)
    ):
        added.update(cache_headers())
    return [(k.encode(), v.encode()) for k, v in added.items()]


def _headers(version: Version) -> dict[str, str]:
    return {HEADER: f"{SERVICE_TYPE} {version}", "vary": HEADER}


def cache_headers() -> dict[str, str]:
    """From 1.15 every successful read says ``no-cache`` and when it was last modified.
    Placement gives the newest ``updated_at`` of what it shows where it has one and the
    time of the answer otherwise; loadmaster gives the time of the answer, which is never
    older than the truth, so a client never keeps a stale copy because of it."""
    return {
        "cache-control": "no-cache",
        "last-modified": format_datetime(datetime.now(UTC), usegmt=True),
    }
