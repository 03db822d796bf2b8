"""Every error the API sends has one shape: loadmaster's ``{code, title, detail}`` (+
``field``), which its own CLI and agents read, and beside it Placement's ``errors`` list
(``[{status, title, detail, request_id, code}]``, ``code`` from microversion 1.23), which
OpenStack's clients read. Both describe the same single error.

Domain errors carry their own status and code (``LoadmasterError.to_dict``); the few
errors born in the web layer (bad JSON, schema violations, auth, unknown routes, bodies
too large) are turned into a ``LoadmasterError`` subclass here, so one function renders
them all.

This module turns every failure into the one error shape.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loadmaster.api import microversion, queries
from loadmaster.api.observability import request_id_var
from loadmaster.errors import (
    BadQueryValue,
    Busy,
    ConcurrentUpdate,
    Conflict,
    DuplicateName,
    DuplicateQueryKey,
    HostHasChildren,
    HostInUse,
    InventoryInUse,
    LoadmasterError,
    MissingQueryValue,
    NotFound,
    NoValidHost,
    PluginFailed,
    SchedulerUnavailable,
    StoreUnavailable,
    UnknownProviderInBody,
    ValidationError,
)
from loadmaster.shapes import BOUND_WORDS, field_path

log = logging.getLogger("loadmaster.api")


class PlacementError(BaseModel):
    """One entry of Placement's ``errors`` list (the OpenStack API-WG error guideline)."""

    status: int
    title: str
    detail: str
    request_id: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """What every non-2xx response carries."""

    code: str
    title: str
    detail: str
    field: str | None = None
    errors: list[PlacementError]


class InvalidJson(ValidationError):
    code = "loadmaster.invalid_json"
    title = "Malformed JSON"


class Unauthenticated(LoadmasterError):
    code = "loadmaster.unauthenticated"
    title = "Authentication required"


class Forbidden(LoadmasterError):
    code = "loadmaster.forbidden"
    title = "Forbidden"


class MethodNotAllowed(LoadmasterError):
    code = "loadmaster.method_not_allowed"
    title = "Method not allowed"


class BodyTooLarge(LoadmasterError):
    code = "loadmaster.body_too_large"
    title = "Request body too large"


class NotAcceptable(LoadmasterError):
    code = "loadmaster.not_acceptable"
    title = "Not acceptable"


class UnsupportedMediaType(LoadmasterError):
    code = "loadmaster.unsupported_media_type"
    title = "Unsupported media type"


JSON = "application/json"
# What Placement says for a path it does not serve (at the request's microversion).
NOT_FOUND = "The resource could not be found."


def media_type_refused(content_type: str | None) -> UnsupportedMediaType:
    """In Placement's words, which name a missing type ``None``."""
    return UnsupportedMediaType(
        f"The media type {content_type} is not supported, use {JSON}", field="body"
    )


class InternalError(LoadmasterError):
    code = "loadmaster.internal"
    title = "Internal error"


class HttpError(LoadmasterError):
    """An HTTP error Starlette raised with a status no class below names."""

    code = "loadmaster.http_error"
    title = "HTTP error"

    def __init__(self, detail: str, status: int) -> None:
        super().__init__(detail)
        self.status = status


# Every error's HTTP status, in one place; the most specific class comes first.
STATUS_OF: tuple[tuple[type[LoadmasterError], int], ...] = (
    (microversion.UnacceptableVersion, 406),
    (microversion.BadVersion, 400),
    (Unauthenticated, 401),
    (Forbidden, 403),
    (MethodNotAllowed, 405),
    (NotAcceptable, 406),
    (BodyTooLarge, 413),
    (UnsupportedMediaType, 415),
    (InternalError, 500),
    (PluginFailed, 500),
    (StoreUnavailable, 503),
    (SchedulerUnavailable, 503),
    (Busy, 503),
    (NotFound, 404),
    (Conflict, 409),
    (NoValidHost, 409),
    (ValidationError, 400),
    (LoadmasterError, 400),
)


def status_of(error: LoadmasterError) -> int:
    if isinstance(error, HttpError):
        return error.status
    return next(status for kind, status in STATUS_OF if isinstance(error, kind))


# Placement's codes for loadmaster's errors that Placement names; any other is
# ``placement.undefined_code``, as Placement answers for an error it gives no code.
PLACEMENT_CODES = {
    ConcurrentUpdate.code: "placement.concurrent_update",
    DuplicateName.code: "placement.duplicate_name",
    HostHasChildren.code: "placement.resource_provider.cannot_delete_parent",
    HostInUse.code: "placement.resource_provider.inuse",
    InventoryInUse.code: "placement.inventory.inuse",
    UnknownProviderInBody.code: "placement.resource_provider.not_found",
    MissingQueryValue.code: "placement.query.missing_value",
    BadQueryValue.code: "placement.query.bad_value",
    DuplicateQueryKey.code: "placement.query.duplicate_key",
}
UNDEFINED_CODE = "placement.undefined_code"
# From this version Placement's candidates schema names its groups' parameters by pattern,
# and refuses others as matching none of them.
PATTERN_PARAMS_SINCE = (1, 25)
ERROR_CODE_SINCE = (1, 23)

# Documented on every route: schemathesis and client authors see the real error shape.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {
        "model": ErrorBody,
        "description": "Client error: `{code, title, detail, field, errors}`",
    },
    "5XX": {"model": ErrorBody, "description": "Server or database unavailable"},
}


# The database restarts in seconds (failover, a pg_ctl restart); a client told to wait a
# moment retries when it is likely back rather than hammering it.
RETRY_AFTER_S = "2"


def error_response(
    error: LoadmasterError, headers: Mapping[str, str] | None = None, *, placement: bool = False
) -> JSONResponse:
    """``placement``: answering one of Placement's routes, in its words where they differ."""
    if isinstance(error, StoreUnavailable | SchedulerUnavailable):
        headers = {**(headers or {}), "Retry-After": RETRY_AFTER_S}
    elif isinstance(error, Busy):
        headers = {**(headers or {}), "Retry-After": str(error.retry_after_s)}
    detail = (error.placement_detail if placement else None) or error.detail
    body = {**error.to_dict(), "detail": detail, "errors": [placement_error(error, detail)]}
    return JSONResponse(body, status_code=status_of(error), headers=headers)


def placement_error(error: LoadmasterError, detail: str | None = None) -> dict[str, object]:
    """``error`` as an entry of Placement's ``errors`` list: its title is the status's
    reason phrase, as Placement's (webob's) is."""
    entry: dict[str, object] = {
        "status": status_of(error),
        "title": HTTPStatus(status_of(error)).phrase,
        "detail": detail or error.detail,
    }
    if microversion.current().matches(*ERROR_CODE_SINCE):
        entry["code"] = PLACEMENT_CODES.get(error.code, UNDEFINED_CODE)
    request_id = request_id_var.get()
    if request_id is not None:
        entry["request_id"] = request_id
    if isinstance(error, microversion.UnacceptableVersion):
        entry["max_version"] = str(microversion.MAX)
        entry["min_version"] = str(microversion.MIN)
    return entry


def field_of(loc: Sequence[int | str]) -> str | None:
    """``("body", "inventories", "VCPU", "total")`` -> ``inventories.VCPU.total``;
    list positions become ``[i]`` as in the domain's own error fields."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        where = parts.pop(0)
        if where != "body" and parts:
            parts[0] = f"{where}.{parts[0]}"
    return field_path(parts)


# Placement's own routes, whose clients and tests read its JSON Schema wording; every
# other route says what is wrong in plain words (``_plain_words``).
_PLACEMENT_PATH = re.compile(
    r"^/(?:(?:resource_providers|resource_classes|traits|allocations|allocation_candidates)"
    r"(?:/.*)?|reshaper|usages)?$"
)


def is_placement_path(path: str) -> bool:
    return _PLACEMENT_PATH.match(path) is not None


def from_validation(
    exc: RequestValidationError, content_type: str | None, *, placement: bool = True
) -> LoadmasterError:
    first = exc.errors()[0]
    missing_body = first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",)
    if missing_body and content_type is None:
        # Nothing was sent, not even its type: Placement names the missing type.
        return media_type_refused(None)
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", "not JSON")
        return InvalidJson(f"Malformed JSON: {reason}", field="body")
    loc = tuple(first.get("loc", ()))
    if loc == ("body",) and isinstance(first.get("input"), bytes):
        return UnsupportedMediaType(
            "the request body must be JSON, sent as Content-Type: application/json", field="body"
        )
    field = field_of(loc)
    more = len(exc.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    if not placement:
        return ValidationError(f"{field or 'body'}: {_plain_words(first)}{suffix}", field=field)
    message = _schema_words(first)
    # Placement's prefix for a body its schema refuses, which its clients look for.
    prefix = "JSON does not validate: " if loc[:1] == ("body",) else ""
    if prefix:
        # Placement's words straight after its prefix (its tests match the whole phrase).
        return ValidationError(f"{prefix}{message} (at {field or 'body'}){suffix}", field=field)
    return ValidationError(f"{field or 'body'}: {message}{suffix}", field=field)


_SHOWN_INPUT = 60
_PLAIN_TYPES = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _plain_words(error: Mapping[str, Any]) -> str:
    """pydantic's complaint as the reason after the field's name: what was given and
    what is wanted, without schema paths."""
    kind = str(error.get("type"))
    given = repr(error.get("input"))
    if len(given) > _SHOWN_INPUT:
        # A reason is one line: a long value is shown by its start.
        given = given[: _SHOWN_INPUT - 3] + "..."
    ctx = error.get("ctx", {})
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return "is not a field"
    if kind == "missing":
        return "is required"
    if kind in _PLAIN_TYPES:
        return f"must be {_PLAIN_TYPES[kind]}, got {given}"
    if kind in BOUND_WORDS:
        words, key = BOUND_WORDS[kind]
        return f"must be {words} {ctx.get(key)}, got {given}"
    return f"{error.get('msg', 'invalid value')}, got {given}"


def _schema_words(error: Mapping[str, Any]) -> str:
    """pydantic's complaint in the words of the JSON Schema check Placement runs (its
    clients and tests look for them: "Additional properties are not allowed", "Failed
    validating 'maxLength'"), after pydantic's own message."""
    kind = error.get("type")
    message = str(error.get("msg", "invalid value"))
    loc = tuple(error.get("loc", ()))
    ctx = error.get("ctx", {})
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return f"unknown field: Additional properties are not allowed ({loc[-1]!r} was unexpected)"
    if kind == "missing":
        return f"field required: {loc[-1]!r} is a required property. Failed validating 'required'"
    keyword = {
        "string_too_long": "maxLength",
        "string_too_short": "minLength",
        "string_pattern_mismatch": "pattern",
        "greater_than_equal": "minimum",
        "greater_than": "exclusiveMinimum",
        "less_than_equal": "maximum",
        "too_long": "maxItems",
        "too_short": "minItems",
    }.get(str(kind))
    json_type = {
        "int_type": "integer",
        "int_parsing": "integer",
        "float_type": "number",
        "string_type": "string",
        "bool_type": "boolean",
        "list_type": "array",
        "sequence_str": "array",
        "dict_type": "object",
        "model_type": "object",
        "model_attributes_type": "object",
    }.get(str(kind))
    if json_type:
        return f"{error.get('input')!r} is not of type {json_type!r}. Failed validating 'type'"
    if keyword == "pattern":
        message = f"{error.get('input')!r} does not match {ctx.get('pattern')!r}"
    elif keyword == "minimum":
        message = f"{error.get('input')!r} is less than the minimum of {ctx.get('ge')}"
    elif keyword == "maximum":
        message = f"{error.get('input')!r} is greater than the maximum of {ctx.get('le')}"
    if not keyword:
        return message
    # jsonschema names where in the schema the check failed; Placement's tests match it.
    where = "".join(f"['properties'][{part!r}]" for part in loc[1:] if isinstance(part, str))
    return f"{message}. Failed validating {keyword!r} in schema{where}"


def from_http(exc: StarletteHTTPException) -> LoadmasterError:
    """Starlette's own refusals (no route, a method the path lacks) as the first error of
    their status in ``STATUS_OF``."""
    for kind, status in STATUS_OF:
        if status == exc.status_code and kind not in _VERSION_ERRORS:
            return kind(str(exc.detail))
    return HttpError(str(exc.detail), exc.status_code)


# Raised by the microversion middleware only, never for Starlette's own refusals.
_VERSION_ERRORS = (microversion.UnacceptableVersion, microversion.BadVersion)


def install(app: FastAPI) -> None:
    """Route every failure through ``error_response``."""

    async def domain(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, LoadmasterError)
        return error_response(exc, placement=is_placement_path(request.url.path))

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(
            from_validation(
                exc,
                request.headers.get("content-type"),
                placement=is_placement_path(request.url.path),
            )
        )

    async def http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        error = from_http(exc)
        if exc.status_code == 405:
            # Starlette lists only the first matching route's methods; a path served by
            # several routes (GET and POST /vms) must list them all.
            headers["Allow"] = ", ".join(sorted(_allowed_methods(app, request.url.path)))
            error = MethodNotAllowed(
                f"The method {request.method} is not allowed for this resource."
            )
        elif exc.status_code == 404 and request.scope.get("route") is None:
            error = NotFound(NOT_FOUND)
        return error_response(error, headers=headers)

    app.add_exception_handler(LoadmasterError, domain)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http)
    # Unexpected exceptions are answered by ``CatchUnexpected`` (see there why not here).


def internal_error() -> JSONResponse:
    return error_response(
        InternalError("internal error; the server log has the details under this request id")
    )


class CatchUnexpected:
    """Answers an unexpected exception with a 500 in the error shape, and keeps the
    connection open. Starlette's own last-resort handler re-raises after answering, and
    uvicorn then closes the keep-alive connection: a client's next request on it fails, and
    a retried POST cannot tell whether the first one landed. The traceback goes to the log
    (with the request id), never to the client."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if started:
                raise  # half an answer is out: closing is the only honest end
            await internal_error()(scope, receive, send)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _allowed_methods(app: FastAPI, path: str) -> set[str]:
    """The methods some route fully matches for ``path``, asked through Starlette's own
    matching (included routers are not flattened into ``app.routes``)."""
    allowed = set()
    for method in _METHODS:
        scope = {"type": "http", "path": path, "method": method, "root_path": "", "app": app}
        if any(route.matches(scope)[0] is Match.FULL for route in app.routes):
            allowed.add(method)
    return allowed


class BodySizeLimit:
    """Refuses bodies over the limit without reading them whole: a declared
    Content-Length is checked before anything is read, a streamed (chunked) body as its
    bytes arrive. (FastAPI's own ``max_body_size`` answers in plain text, not in the
    error shape, so it is not used.)"""

    def __init__(self, app: ASGIApp, max_body_size: int) -> None:
        self.app = app
        self.max_body_size = max_body_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit():
            if int(declared) > self.max_body_size:
                await error_response(BodyTooLarge(self._detail()))(scope, receive, send)
                return
            if b"transfer-encoding" not in headers:
                # The server hands over no more than the declared length: nothing to count.
                await self.app(scope, receive, send)
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_size:
                # An HTTPException is the one error FastAPI lets out of its body reading
                # unchanged; the handler above renders it as BodyTooLarge.
                raise HTTPException(413, self._detail())
            return message

        await self.app(scope, counted, send)

    def _detail(self) -> str:
        return f"request bodies are limited to {self.max_body_size} bytes"


async def no_nul(request: Request) -> None:
    """A NUL character is refused wherever it appears (path segment, query value, any
    string or key of a JSON body) with a 400 naming the field: PostgreSQL cannot store it
    (and failed with a 500, even for a reader's lookup) while SQLite stored it silently."""
    for name, value in request.path_params.items():
        if isinstance(value, str) and "\x00" in value:
            raise _nul(f"path.{name}")
    if request.scope["query_string"]:
        for name, value in request.query_params.multi_items():
            if "\x00" in name or "\x00" in value:
                raise _nul(f"query.{name}")
    body = await request.body()
    if b"\\u0000" not in body and b"\x00" not in body:
        return
    try:
        data = json.loads(body)
    except ValueError:
        return  # not JSON: the body's own validation says so
    where = _nul_in(data, "")
    if where is not None:
        raise _nul(where or "body")


def _nul(field: str) -> ValidationError:
    return ValidationError(f"{field}: contains a NUL character (\\u0000)", field=field)


def _nul_in(data: object, path: str) -> str | None:
    """The dotted path of the first string or key holding a NUL, if any."""
    if isinstance(data, str):
        return path if "\x00" in data else None
    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{path}.{key}" if path else str(key)
            if "\x00" in key:
                return here
            found = _nul_in(value, here)
            if found is not None:
                return found
    if isinstance(data, list):
        for i, value in enumerate(data):
            found = _nul_in(value, f"{path}[{i}]")
            if found is not None:
                return found
    return None


async def no_unknown_query(request: Request) -> None:
    """Unknown query parameters are refused like unknown body fields: a typo such as
    ``?stat=up`` must not quietly list every host."""
    route = request.scope.get("route")
    if not request.scope["query_string"] or not isinstance(route, APIRoute):
        return
    known = {param.alias for param in route.dependant.query_params}
    # A route whose parameter names are open-ended (Placement's "resources1", "required_X")
    # names their pattern, and judges them itself.
    pattern = getattr(route.endpoint, "query_pattern", None)
    for name in request.query_params:
        if name not in known and not (pattern is not None and pattern.match(name)):
            version = microversion.current()
            if pattern is not None and version.matches(*PATTERN_PARAMS_SINCE):
                regexes = getattr(route.endpoint, "query_regexes", None)
                raise queries.unmatched(name, regexes(version) if regexes else ())
            raise ValidationError(
                # Placement's words first, which its clients look for.
                "Invalid query string parameters: Additional properties are not allowed "
                f"({name!r} was unexpected); known: {', '.join(sorted(known)) or 'none'}",
                field=f"query.{name}",
            )
