"""The placement path answered without the middleware stack: ``POST /schedule``,
``POST /vms`` and ``POST /vms/{uuid}/start`` (``HOT_PATHS``).

Through the stack, one of these requests crossed seventeen ASGI layers (FastAPI's and
Starlette's own, loadmaster's eight, the router's), solved its dependencies, and hopped to
the thread pool twice (the endpoint, then the response's validation): more than twice
the time this path takes, and much of the event loop's share of the server's GIL
(docs/architecture.md has the figures). Here a request that takes the common way is
checked, run and answered in one pass, with one hop to a thread:

- the same checks, each by the same function the stack uses: the request id, the
  microversion (``microversion.requested``), the token (``request_role``), the body's
  size and media type, the route's availability at the version;
- the same endpoint function, with the same arguments FastAPI would build, and the same
  prepared validators of the route (its ``body_field`` and ``response_field``), so the
  body is judged and the answer serialised exactly as before;
- the same answer headers (``microversion.labels``, ``id_headers``), error rendering
  (``error_response``), metrics and log line (``record_request``).

Whatever is not the common way goes down the stack, untouched and answered by it as
before: another role than ``admin`` (401, 403), a version header that does not parse, a
body that is not JSON or does not validate, a NUL anywhere, a query string, a chunked or
oversized body, a client asking for HTML errors. A body already read is handed to the
stack as it came. So every refusal keeps its one implementation, in the stack; only the
happy path and the domain's own errors (rendered by ``error_response``, as the stack's
handler does) are answered here.

The routes stay declared on the app as before: the OpenAPI document describes them from
their models, and tests may call them through the stack (``DirectRoutes.enabled``).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import ResponseValidationError
from fastapi.routing import APIRoute
from starlette.types import Message, Receive, Scope, Send

from loadmaster.api import deps, errors, microversion
from loadmaster.api.auth import TokenTable, request_role
from loadmaster.api.observability import id_headers, record_request, request_id_of, request_id_var
from loadmaster.errors import LoadmasterError

log = logging.getLogger("loadmaster.api")

# (method, path template) of the routes answered here.
HOT_PATHS = (("POST", "/schedule"), ("POST", "/vms"), ("POST", "/vms/{uuid}/start"))
# As many threads as Starlette's pool lends sync endpoints (anyio's default limiter):
# concurrent placements wait in the scheduler together, which decides them as one batch.
THREADS = 40
_JSON = b"application/json"
_JSON_HEADERS = [(b"content-type", _JSON)]

ASGI = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class _Parameters:
    """What the endpoint takes, by name: the app's services (parameter, attribute of the
    app's state), the request, path parameters and the body."""

    services: tuple[tuple[str, str], ...]
    request: str | None
    path: tuple[str, ...]
    body: str | None


# The dependencies a direct route may have: the services (given by name) and the app's
# checks, which the direct path makes itself (no query string; no NUL in path or body).
_SERVICES = {deps._loadmaster: "lm", deps._metrics: "metrics", deps._vm_creates: "vm_creates"}
_CHECKS = (errors.no_nul, errors.no_unknown_query)


def _parameters(route: APIRoute) -> _Parameters:
    """The endpoint's parameters, if the direct path can build every one of them as
    FastAPI would; else ``ValueError`` (the route then stays with the stack)."""
    dependant = route.dependant
    if (
        dependant.query_params
        or dependant.header_params
        or dependant.cookie_params
        or len(dependant.body_params) > 1
        or dependant.response_param_name
        or dependant.background_tasks_param_name
        or dependant.websocket_param_name
        or dependant.http_connection_param_name
        or dependant.security_scopes_param_name
        or route.response_field is None
    ):
        raise ValueError(f"{route.path}: parameters the direct path does not build")
    services: list[tuple[str, str]] = []
    for sub in dependant.dependencies:
        if sub.call in _SERVICES and sub.name is not None:
            services.append((sub.name, _SERVICES[sub.call]))
        elif sub.call not in _CHECKS:
            raise ValueError(f"{route.path}: dependency {sub.call!r}")
    body = dependant.body_params[0].name if dependant.body_params else None
    return _Parameters(
        tuple(services),
        dependant.request_param_name,
        tuple(field.name for field in dependant.path_params),
        body,
    )


class _Direct:
    """One route answered directly."""

    def __init__(self, route: APIRoute) -> None:
        self.route = route
        (self.method,) = tuple(route.methods or ())
        self.params = _parameters(route)
        self.regex = route.path_regex
        self.status = route.status_code or 200

    def answer(self, kwargs: dict[str, Any]) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """The endpoint's answer (in a worker thread): status, JSON body, headers."""
        route = self.route
        raw = route.endpoint(**kwargs)
        if isinstance(raw, Response):
            return raw.status_code, bytes(raw.body), raw.raw_headers
        field = route.response_field
        assert field is not None
        value, problems = field.validate(raw, {}, loc=("response",))
        if problems:
            raise ResponseValidationError(errors=problems, body=raw)
        body = field.serialize_json(
            value,
            include=route.response_model_include,
            exclude=route.response_model_exclude,
            by_alias=route.response_model_by_alias,
            exclude_unset=route.response_model_exclude_unset,
            exclude_defaults=route.response_model_exclude_defaults,
            exclude_none=route.response_model_exclude_none,
        )
        return self.status, body, [(b"content-length", str(len(body)).encode()), *_JSON_HEADERS]


class DirectRoutes:
    """The direct path of ``app``'s routes in ``HOT_PATHS``; ``fallback`` is the stack."""

    def __init__(
        self,
        app: FastAPI,
        routes: Sequence[APIRoute],
        tokens: TokenTable | None,
        max_body_size: int,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.max_body_size = max_body_size
        self.routes: list[_Direct] = []
        for route in routes:
            if any((method, route.path) in HOT_PATHS for method in route.methods or ()):
                try:
                    self.routes.append(_Direct(route))
                except ValueError:
                    # Answered by the stack, as any route (a test checks none is left so).
                    log.warning("%s is not answered directly", route.path, exc_info=True)
        self.enabled = True
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _match(self, scope: Scope) -> tuple[_Direct, dict[str, str]] | None:
        path = scope["path"]
        if scope["query_string"] or "\x00" in path:
            return None
        for direct in self.routes:
            if direct.method == scope["method"]:
                found = direct.regex.match(path)
                if found is not None:
                    return direct, found.groupdict()
        return None

    def _admitted(self, scope: Scope) -> tuple[bytes | None, microversion.Version] | None:
        """(content type, version) of a request the direct path may answer; None sends it
        down the stack, which refuses it or knows better."""
        content_type = length = None
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding" or (name == b"accept" and b"html" in value.lower()):
                return None  # a chunked body; a browser, which gets HTML errors
        if length is not None and not (
            length.strip().isdigit() and int(length) <= self.max_body_size
        ):
            return None
        if content_type is not None and content_type.split(b";")[0].strip().lower() != _JSON:
            return None
        try:
            version = microversion.requested(scope)
        except LoadmasterError:
            return None
        if self.tokens is not None and request_role(scope, self.tokens) != "admin":
            return None
        return content_type, version

    async def __call__(self, scope: Scope, receive: Receive, send: Send, fallback: ASGI) -> None:
        started = time.perf_counter()
        # Overridden dependencies (tests) are FastAPI's to apply.
        enabled = self.enabled and not self.app.dependency_overrides
        found = self._match(scope) if enabled else None
        admitted = self._admitted(scope) if found is not None else None
        if found is None or admitted is None:
            await fallback(scope, receive, send)
            return
        direct, path_params = found
        content_type, version = admitted
        read: list[Message] = []
        chunks = []
        size = 0
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_body_size or not message.get("more_body", False):
                break
        body = b"".join(chunks)
        token = microversion.use(version)
        try:
            kwargs = self._arguments(direct, scope, path_params, content_type, body, read)
        finally:
            microversion.done(token)
        if kwargs is None:
            await fallback(scope, _replay(read, receive), send)
            return
        await self._serve(direct, scope, send, kwargs, version, started)

    def _arguments(
        self,
        direct: _Direct,
        scope: Scope,
        path_params: dict[str, str],
        content_type: bytes | None,
        body: bytes,
        read: list[Message],
    ) -> dict[str, Any] | None:
        """The endpoint's arguments, or None for a request the stack must judge."""
        route = direct.route
        if (
            read[-1]["type"] != "http.request"
            or read[-1].get("more_body", False)
            or (body and content_type is None)
            or b"\x00" in body
            or b"\\u0000" in body
            or not microversion.route_available(route.openapi_extra)
        ):
            return None
        params = direct.params
        kwargs: dict[str, Any] = {name: path_params[name] for name in params.path}
        state = self.app.state
        for name, attribute in params.services:
            kwargs[name] = getattr(state, attribute)
        if params.request is not None:
            kwargs[params.request] = Request(scope)
        if params.body is not None:
            field = route.body_field
            assert field is not None
            if body:
                try:
                    given = json.loads(body)
                except (ValueError, RecursionError):  # nested deeper than the parser goes
                    return None
                value, problems = field.validate(given, {}, loc=("body",))
                if problems:
                    return None
            elif field.field_info.is_required():
                return None
            else:
                value = deepcopy(field.default)
            kwargs[params.body] = value
        return kwargs

    async def _serve(
        self,
        direct: _Direct,
        scope: Scope,
        send: Send,
        kwargs: dict[str, Any],
        version: microversion.Version,
        started: float,
    ) -> None:
        scope["app"] = self.app
        if self.tokens is not None:
            scope.setdefault("state", {})["role"] = "admin"
        request_id = request_id_of(scope)
        id_token = request_id_var.set(request_id)
        version_token = microversion.use(version)
        status = 500
        try:
            try:
                context = contextvars.copy_context()
                status, body, headers = await asyncio.get_running_loop().run_in_executor(
                    self._executor(), context.run, direct.answer, kwargs
                )
            except LoadmasterError as exc:
                response = errors.error_response(exc)
                status, body, headers = (
                    response.status_code,
                    bytes(response.body),
                    response.raw_headers,
                )
            except Exception:
                log.exception("unhandled error on %s %s", scope["method"], scope["path"])
                response = errors.internal_error()
                status, body, headers = (
                    response.status_code,
                    bytes(response.body),
                    response.raw_headers,
                )
            headers = [
                *headers,
                *microversion.labels(version, scope["method"], status),
                *id_headers(request_id),
            ]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        finally:
            seconds = time.perf_counter() - started
            record_request(self.app.state.metrics, scope, direct.route.path, status, seconds)
            microversion.done(version_token)
            request_id_var.reset(id_token)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="loadmaster-api")
        return self._pool


def _replay(read: list[Message], receive: Receive) -> Receive:
    """``receive`` as if nothing had been read: the messages read first, then the rest."""
    pending = list(read)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
