"""The endpoints called most, answered without FastAPI's router: the placement path's
``POST /schedule``, ``POST /vms`` and ``POST /vms/{uuid}/start``, and the agents'
``POST /hosts/{host_name}/report`` (``HOT_PATHS``).

``DirectEndpoints`` is the innermost layer of the request pipeline (``api.pipeline``):
a request reaches it only after every stage has done its work, as for any request (its
id, log line and metrics, its version, its token, its body's size, its media types, the
catching of unexpected errors). What it skips is FastAPI's routing: its exception
middleware, the router, the solving of dependencies and two hops to the thread pool
(the endpoint, then the answer's validation). A request that takes the common way is
answered here with one hop to a thread, or none for arguments its endpoint answers
without any I/O (``inline_when``: an agent's measurements, kept in memory):

- the endpoint function is called with the arguments FastAPI would build, found from its
  signature: the dependencies that take only the request (the app's services), the
  request, path parameters as given, and the body validated by a pydantic ``TypeAdapter``
  of its annotation;
- the app's and the route's checks (their ``dependencies``) run first, as FastAPI runs
  them;
- the answer is validated and serialised by a ``TypeAdapter`` of the route's
  ``response_model``, with the route's include/exclude options, as FastAPI does;
- an error the endpoint raises is answered by the app's handler for it
  (``app.exception_handlers``); any other goes up to the pipeline's catcher.

Whatever is not the common way goes on to the router, untouched, the body already read
handed over as it came: a chunked body, a body that is not JSON or does not validate, a
check that refuses (a NUL, a query string). So every refusal keeps its one
implementation; only the happy path and the domain's own errors are answered here.

The routes stay declared on the app: the OpenAPI document describes them from their
models, and tests may have them answered by the router (``DirectRoutes.enabled``).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import json
import logging
import types
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from copy import deepcopy
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin, get_type_hints

import pydantic
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import ResponseValidationError
from fastapi.params import Depends
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loadmaster.errors import LoadmasterError

log = logging.getLogger("loadmaster.api")

# (method, path template) of the routes answered here.
HOT_PATHS = (
    ("POST", "/schedule"),
    ("POST", "/vms"),
    ("POST", "/vms/{uuid}/start"),
    ("POST", "/hosts/{host_name}/report"),
)
# As many threads as Starlette's pool lends sync endpoints (anyio's default limiter):
# concurrent placements wait in the scheduler together, which decides them as one batch.
THREADS = 40
THREAD_PREFIX = "loadmaster-api"
_JSON = "application/json"
_REQUIRED = object()

RequestDependency = Callable[[Request], Awaitable[Any]]
# Whether an endpoint answers these arguments without I/O (see ``inline_when``).
InlineTest = Callable[[dict[str, Any]], bool]
_INLINE = "_answered_inline_when"
_Endpoint = TypeVar("_Endpoint", bound=Callable[..., Any])


def inline_when(test: InlineTest) -> Callable[[_Endpoint], _Endpoint]:
    """Mark a sync endpoint whose call, for arguments ``test`` accepts, neither reads nor
    writes anything but memory and takes no lock held across I/O: the direct path then
    calls it on the event loop. A thread hop costs more than such a call does."""

    def mark(endpoint: _Endpoint) -> _Endpoint:
        setattr(endpoint, _INLINE, test)
        return endpoint

    return mark


class _Refused(Exception):
    """A request the direct path leaves to the router."""


def _request_only(call: Any, where: str) -> RequestDependency:
    """``call`` if it is an async function of the request alone; else ``ValueError``."""
    if not inspect.iscoroutinefunction(call):
        raise ValueError(f"{where}: dependency {call!r} is not async")
    hints = get_type_hints(call)
    parameters = list(inspect.signature(call).parameters)
    if len(parameters) != 1 or hints.get(parameters[0]) is not Request:
        raise ValueError(f"{where}: dependency {call!r} takes more than the request")
    return call


def _dependency(hint: Any, where: str) -> RequestDependency | None:
    """The dependency an ``Annotated[T, Depends(f)]`` parameter names, if it is one."""
    if get_origin(hint) is not Annotated:
        return None
    for meta in hint.__metadata__:
        if isinstance(meta, Depends):
            return _request_only(meta.dependency, where)
    return None


def _is_model(hint: Any) -> bool:
    """Whether ``hint`` is a model (a pydantic model or a dataclass, which FastAPI reads
    from the body), or a union of models and None."""
    if isinstance(hint, type):
        return issubclass(hint, pydantic.BaseModel) or dataclasses.is_dataclass(hint)
    if get_origin(hint) in (Union, types.UnionType):
        return all(arg is type(None) or _is_model(arg) for arg in get_args(hint))
    return False


class _Direct:
    """One route answered directly; ``ValueError`` for one whose endpoint takes what the
    direct path does not build (it then stays with the router)."""

    def __init__(self, route: APIRoute, checks: Sequence[Depends]) -> None:
        self.route = route
        (self.method,) = tuple(route.methods or ())
        endpoint = route.endpoint
        where = route.path
        model = route.response_model
        if inspect.iscoroutinefunction(endpoint) or model is None:
            raise ValueError(f"{where}: an async endpoint, or no response model")
        hints = get_type_hints(endpoint, include_extras=True)
        self.services: list[tuple[str, RequestDependency]] = []
        self.request: str | None = None
        self.path: list[str] = []
        self.body: tuple[str, pydantic.TypeAdapter[Any], Any] | None = None
        for name, parameter in inspect.signature(endpoint).parameters.items():
            hint: Any = hints.get(name)
            service = _dependency(hint, where)
            if service is not None:
                self.services.append((name, service))
            elif hint is Request:
                self.request = name
            elif name in route.param_convertors and hint is str:
                self.path.append(name)
            elif self.body is None and _is_model(hint):
                default = (
                    _REQUIRED if parameter.default is inspect.Parameter.empty else parameter.default
                )
                self.body = (name, pydantic.TypeAdapter(hint), default)
            else:
                raise ValueError(f"{where}: parameter {name} is not built by the direct path")
        self.checks = [_request_only(d.dependency, where) for d in (*checks, *route.dependencies)]
        self.answers: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(model)
        self.status = route.status_code or 200
        self.inline: InlineTest | None = getattr(endpoint, _INLINE, None)

    async def arguments(
        self, request: Request, path_params: dict[str, str], body: bytes
    ) -> dict[str, Any]:
        """The endpoint's arguments, as FastAPI builds them; ``_Refused`` for a request
        the router must judge."""
        try:
            for check in self.checks:
                await check(request)
        except LoadmasterError as exc:
            raise _Refused from exc
        kwargs: dict[str, Any] = {name: path_params[name] for name in self.path}
        for name, service in self.services:
            kwargs[name] = await service(request)
        if self.request is not None:
            kwargs[self.request] = request
        if self.body is not None:
            name, adapter, default = self.body
            if body:
                try:
                    kwargs[name] = adapter.validate_python(json.loads(body))
                except (ValueError, RecursionError) as exc:  # pydantic's error is a ValueError
                    raise _Refused from exc
            elif default is _REQUIRED:
                raise _Refused
            else:
                kwargs[name] = deepcopy(default)
        return kwargs

    def answer(self, kwargs: dict[str, Any]) -> Response:
        """The endpoint's answer (in a worker thread, or inline: ``inline_when``)."""
        route = self.route
        raw = route.endpoint(**kwargs)
        if isinstance(raw, Response):
            return raw
        try:
            value = self.answers.validate_python(raw, from_attributes=True)
        except pydantic.ValidationError as exc:
            raise ResponseValidationError(errors=exc.errors(include_url=False), body=raw) from exc
        body = self.answers.dump_json(
            value,
            include=route.response_model_include,
            exclude=route.response_model_exclude,
            by_alias=route.response_model_by_alias,
            exclude_unset=route.response_model_exclude_unset,
            exclude_defaults=route.response_model_exclude_defaults,
            exclude_none=route.response_model_exclude_none,
        )
        return Response(body, status_code=self.status, media_type=_JSON)


class DirectRoutes:
    """The direct answers of ``app``'s routes in ``HOT_PATHS``, and their threads."""

    def __init__(self, app: FastAPI, routes: Sequence[APIRoute]) -> None:
        self.app = app
        self.routes: list[_Direct] = []
        for route in routes:
            if any((method, route.path) in HOT_PATHS for method in route.methods or ()):
                try:
                    # The app's own checks come first, as FastAPI runs them.
                    self.routes.append(_Direct(route, app.router.dependencies))
                except ValueError:
                    # Answered by the router, as any route (a test checks none is left so).
                    log.warning("%s is not answered directly", route.path, exc_info=True)
        self.enabled = True
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def match(self, scope: Scope) -> tuple[_Direct, MutableMapping[str, Any]] | None:
        """The direct route of ``scope`` and its child scope, if it has one and may take
        it (overridden dependencies, in tests, are FastAPI's to apply)."""
        if not self.enabled or self.app.dependency_overrides:
            return None
        method = scope["method"]
        for direct in self.routes:
            # The method first: most requests are not these routes', and it costs least.
            if direct.method == method:
                found, child = direct.route.matches(scope)
                if found is Match.FULL:
                    return direct, child
        return None

    def executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix=THREAD_PREFIX)
        return self._pool


class DirectEndpoints:
    """The pipeline's innermost layer: ``routes``' requests answered here, every other
    request passed on to ``app`` (FastAPI's router)."""

    def __init__(self, app: ASGIApp, routes: DirectRoutes) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.routes.match(scope) if scope["type"] == "http" else None
        if found is None or any(name == b"transfer-encoding" for name, _ in scope["headers"]):
            await self.app(scope, receive, send)
            return
        direct, child = found
        messages, body = await _read_body(receive)
        if body is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        # What the router records of the route it matched (the log line's template, the
        # checks' view of the route): set here alike.
        scope.update(child)
        request = Request(scope, _replay(messages, receive))
        try:
            kwargs = await direct.arguments(request, child["path_params"], body)
        except _Refused:
            await self.app(scope, _replay(messages, receive), send)
            return
        try:
            if direct.inline is not None and direct.inline(kwargs):
                response = direct.answer(kwargs)
            else:
                response = await asyncio.get_running_loop().run_in_executor(
                    self.routes.executor(), contextvars.copy_context().run, direct.answer, kwargs
                )
        except Exception as exc:
            response = await self._handled(request, exc)
        await response(scope, receive, send)

    async def _handled(self, request: Request, exc: Exception) -> Response:
        """The app's answer to ``exc`` from its handler for it, as FastAPI's exception
        middleware gives; an exception without one goes on up (``CatchUnexpected``)."""
        handlers = self.routes.app.exception_handlers
        for kind in type(exc).__mro__:
            handler = handlers.get(kind)
            if handler is not None and kind is not Exception:
                answer = handler(request, exc)
                response = await answer if inspect.isawaitable(answer) else answer
                assert isinstance(response, Response)
                return response
        raise exc


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The messages of the whole body and its bytes (None: the client hung up first)."""
    read: list[Message] = []
    chunks = []
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            return read, None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return read, b"".join(chunks)


def _replay(read: list[Message], receive: Receive) -> Receive:
    """``receive`` as if nothing had been read: the messages read first, then the rest."""
    pending = list(read)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
