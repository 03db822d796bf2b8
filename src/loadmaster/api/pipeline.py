"""The request pipeline: the stages every request passes, in the order it passes them,
defined once (``stages``).

A request crosses them outermost first: agents' long-polls are held (``HeldPolls``,
before anything else keeps state for them); then it gets its id and, at its end, its log
line and metrics; an error answered to a browser becomes an HTML page; its microversion
is read and labels the answer; its token or client certificate is checked; its body's
size is bounded; its route's availability and its media types are judged; an unexpected
error becomes a 500 in the error shape. Innermost, the placement path's endpoints are
answered directly (``api.direct``) and every other request goes on to FastAPI's router.

The fast path is therefore this same pipeline plus the endpoint: a stage added to
``stages`` is crossed by every request, those answered directly included, and nothing a
stage does is done again elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.middleware import Middleware

from loadmaster.api import errors, microversion
from loadmaster.api.auth import AuthMiddleware
from loadmaster.api.longpoll import HeldPolls
from loadmaster.api.negotiation import ContentNegotiation, HtmlErrors
from loadmaster.api.observability import RequestContextMiddleware

# One ASGI layer of the pipeline: ``cls(next_app, *args, **kwargs)``.
Stage = Middleware


def stages(app: FastAPI, routes: Sequence[APIRoute], max_body_size: int) -> list[Stage]:
    """The stages of ``app`` (its state holds the watch, metrics and tokens), in the order
    a request passes them; ``routes``: every route of the app."""
    tokens = app.state.tokens
    return [
        Stage(HeldPolls, watch=app.state.watch, tokens=tokens),
        # Even refused requests get an id and a log line.
        Stage(RequestContextMiddleware, metrics=app.state.metrics),
        Stage(HtmlErrors),
        # Every answer, refusals included, says its version.
        Stage(microversion.MicroversionMiddleware, render=errors.error_response),
        *([Stage(AuthMiddleware, tokens=tokens)] if tokens is not None else []),
        Stage(errors.BodySizeLimit, max_body_size=max_body_size),
        Stage(ContentNegotiation, routes=routes),
        Stage(errors.CatchUnexpected),
    ]


def install(app: FastAPI, pipeline: Sequence[Stage]) -> None:
    """Put ``pipeline`` (outermost first) on ``app``, in front of its router."""
    # Starlette runs the middleware added last first.
    for stage in reversed(pipeline):
        app.add_middleware(stage.cls, *stage.args, **stage.kwargs)
