"""Every error the API sends has one shape, ``{code, title, detail}`` (+ ``field``).

Domain errors carry their own status and code (``LoadmasterError.to_dict``); the few
errors born in the web layer (bad JSON, schema violations, auth, unknown routes, bodies
too large) are turned into a ``LoadmasterError`` subclass here, so one function renders
them all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from loadmaster.errors import LoadmasterError, NotFound, ValidationError

log = logging.getLogger("loadmaster.api")


class ErrorBody(BaseModel):
    """What every non-2xx response carries."""

    code: str
    title: str
    detail: str
    field: str | None = None


class InvalidJson(ValidationError):
    code = "loadmaster.invalid_json"
    title = "Malformed JSON"


class Unauthenticated(LoadmasterError):
    code = "loadmaster.unauthenticated"
    title = "Authentication required"
    status = 401


class Forbidden(LoadmasterError):
    code = "loadmaster.forbidden"
    title = "Forbidden"
    status = 403


class MethodNotAllowed(LoadmasterError):
    code = "loadmaster.method_not_allowed"
    title = "Method not allowed"
    status = 405


class BodyTooLarge(LoadmasterError):
    code = "loadmaster.body_too_large"
    title = "Request body too large"
    status = 413


class UnsupportedMediaType(LoadmasterError):
    code = "loadmaster.unsupported_media_type"
    title = "Unsupported media type"
    status = 415


class InternalError(LoadmasterError):
    code = "loadmaster.internal"
    title = "Internal error"
    status = 500


_BY_STATUS: dict[int, type[LoadmasterError]] = {
    400: ValidationError,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    413: BodyTooLarge,
    415: UnsupportedMediaType,
}

# Documented on every route: schemathesis and client authors see the real error shape.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": "Client error: `{code, title, detail, field}`"},
    "5XX": {"model": ErrorBody, "description": "Server or database unavailable"},
}


def error_response(
    error: LoadmasterError, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error.to_dict(), status_code=error.status, headers=headers)


def field_of(loc: Sequence[int | str]) -> str | None:
    """``("body", "inventories", "VCPU", "total")`` -> ``inventories.VCPU.total``;
    list positions become ``[i]`` as in the domain's own error fields."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        where = parts.pop(0)
        if where != "body" and parts:
            parts[0] = f"{where}.{parts[0]}"
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or None


def from_validation(exc: RequestValidationError) -> LoadmasterError:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", "not JSON")
        return InvalidJson(f"request body is not valid JSON: {reason}", field="body")
    loc = tuple(first.get("loc", ()))
    if loc == ("body",) and isinstance(first.get("input"), bytes):
        return UnsupportedMediaType(
            "the request body must be JSON, sent as Content-Type: application/json", field="body"
        )
    field = field_of(loc)
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "extra_forbidden":
        message = "unknown field"
    elif first.get("type") == "missing":
        message = "field required"
    more = len(exc.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return ValidationError(f"{field or 'body'}: {message}{suffix}", field=field)


def from_http(exc: StarletteHTTPException) -> LoadmasterError:
    kind = _BY_STATUS.get(exc.status_code)
    if kind is None:
        error = LoadmasterError(str(exc.detail))
        error.status = exc.status_code
        return error
    return kind(str(exc.detail))


def install(app: FastAPI) -> None:
    """Route every failure through ``error_response``."""

    async def domain(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, LoadmasterError)
        return error_response(exc)

    async def validation(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(from_validation(exc))

    async def http(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(from_http(exc), headers=exc.headers)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the log, never to the client.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(InternalError("internal error; see the server log"))

    app.add_exception_handler(LoadmasterError, domain)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http)
    app.add_exception_handler(Exception, unexpected)
