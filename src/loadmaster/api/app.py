"""The app factory: ``create_app(lm_or_url, auth)``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Response
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from fastapi.telemetry import TelemetryConfig
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from loadmaster.api import errors, pipeline
from loadmaster.api.auth import OPEN_PATHS, AuthConfig, TokenTable, resolve_auth
from loadmaster.api.batching import Batcher
from loadmaster.api.deps import MetricsDep
from loadmaster.api.direct import DirectEndpoints, DirectRoutes
from loadmaster.api.observability import Metrics, configure_logging
from loadmaster.api.reload import (
    on_sighup,
    reload_certificate,
    reload_policies,
    reload_tokens,
)
from loadmaster.api.responses import HealthOut
from loadmaster.api.routes import (
    agents,
    allocations,
    audit,
    catalog,
    hosts,
    maintenance,
    providers,
    root,
    scheduling,
    vms,
    vocabulary,
)
from loadmaster.api.server import RELEASE_POLLS
from loadmaster.hostcontrol import HostWatch
from loadmaster.hostcontrol.evacuation import AutoEvacuation
from loadmaster.runtime import settle_heap
from loadmaster.scheduler.remote import SchedulingClient
from loadmaster.service import Loadmaster, open_loadmaster
from loadmaster.settings import default
from loadmaster.settings_model import Settings, load_settings

DEFAULT_MAX_BODY: int = default("max_body")
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
DESCRIPTION = """Where virtual machines run, and what each host has promised.

Placement's resources and JSON shapes where the concept is the same (resource classes,
resource providers with inventories, traits, aggregates and usages, allocations,
project usages), plus what Placement lacks: pending state, scheduling with
explanations, server groups, capacity questions and host reports.

Every request needs `Authorization: Bearer <token>` or `X-Auth-Token: <token>` (role
`admin` writes, `reader` reads) unless the server runs with `--no-auth`; over HTTPS with
`--tls-client-ca`, a host's agent may instead present a client certificate naming its
host. Errors are
`{code, title, detail, field}` with a stable dotted `code`, and Placement's `errors` list
beside it. `OpenStack-API-Version: placement X.Y` (1.0 to 1.39, default 1.0) picks
Placement's microversion; `GET /` lists the range."""


def create_app(
    lm: Loadmaster | str | None = None,
    auth: AuthConfig | None = None,
    *,
    max_body_size: int = DEFAULT_MAX_BODY,
    settings: Settings | None = None,
) -> FastAPI:
    """An API over ``lm`` (a ``Loadmaster``, or a database URL to open with ``settings``;
    None: the default database). ``auth=None`` means no authentication (``--no-auth``)."""
    service = lm if isinstance(lm, Loadmaster) else open_loadmaster(lm, settings=settings)
    owned = not isinstance(lm, Loadmaster)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, object]]:
        # Load the scheduler's host arrays now, not on the first placement request.
        service.scheduler.refresh()
        watch: HostWatch = app.state.watch
        await watch.start()
        service.host_agents.watch = watch
        # Fencing configured: this process, like any other serving the same database,
        # fences and evacuates hosts whose agent fell silent (hostcontrol/evacuation.py).
        evacuation = (
            AutoEvacuation(service.evacuation) if service.evacuation.fence_command else None
        )
        if evacuation is not None:
            evacuation.start()
        settle_heap()
        reload = app.state.reload
        stop_reloading = on_sighup(reload) if reload is not None else None
        try:
            # The server ends the held long-polls when it starts to stop (StoppingServer).
            yield {RELEASE_POLLS: watch.release}
        finally:
            if stop_reloading is not None:
                stop_reloading()
            if evacuation is not None:
                await asyncio.to_thread(evacuation.stop)
            service.host_agents.watch = None
            await watch.stop()
            app.state.direct.close()
            if owned:
                service.close()

    app = FastAPI(
        title="loadmaster",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        responses=errors.ERROR_RESPONSES,
        dependencies=[Depends(errors.no_nul), Depends(errors.no_unknown_query)],
        redoc_url=None,
        # ContentNegotiation refuses a body that does not say it is JSON, in the error shape.
        strict_content_type=False,
        # Metrics and logs are loadmaster's own (api/observability.py); FastAPI's native
        # OpenTelemetry is off, so that no request pays for asking whether it is on.
        telemetry=NO_TELEMETRY,
    )
    app.state.lm = service
    # The process's one watcher of host changes, where agents' long-polls wait.
    app.state.watch = HostWatch(
        service.store,
        refresh_s=service.host_agents.heard_every,
        runs_written=service.scheduler.agents_changed,
    )
    app.state.metrics = Metrics(service, app.state.watch)
    app.state.tokens = TokenTable(auth) if auth is not None else None
    app.state.vm_creates = Batcher(service.vms.create_many)
    # What SIGHUP reloads (``api.reload``); ``app_from_env`` sets it, knowing the sources.
    app.state.reload = None
    errors.install(app)
    routers = [
        *(
            m.router
            # Starlette tries the routes in order: the calls made most (placements, a
            # VM's lifecycle, the agents' reports and work lists) first.
            for m in (
                scheduling,
                vms,
                agents,
                root,
                vocabulary,
                providers,
                allocations,
                hosts,
                catalog,
                maintenance,
                audit,
            )
        ),
        _operations_router(),
    ]
    for router in routers:
        app.include_router(router)
    api_routes = [r for router in routers for r in router.routes if isinstance(r, APIRoute)]
    # The placement path's routes are answered without FastAPI's router when a request
    # takes the common way (api/direct.py), behind the same stages as every request.
    app.state.direct = DirectRoutes(app, api_routes)
    pipeline.install(
        app,
        [
            *pipeline.stages(app, api_routes, max_body_size),
            pipeline.Stage(DirectEndpoints, routes=app.state.direct),
        ],
    )
    app.openapi = lambda: _openapi(app, secured=auth is not None)  # type: ignore[method-assign]
    return app


def app_from_env() -> FastAPI:
    """The app of one server process, configured by the settings (``loadmaster.settings``,
    which ``loadmaster serve`` hands its options to worker processes through). Each of
    several uvicorn workers builds its own."""
    configure_logging()
    settings = load_settings()
    auth = resolve_auth(
        no_auth=settings.no_auth,
        tokens_file=settings.tokens_file,
        inline=settings.tokens.get_secret_value(),
    )
    app = create_app(settings.db, auth, max_body_size=settings.max_body, settings=settings)
    app.state.lm.host_agents.silent_after = timedelta(seconds=settings.agent_silent_after)
    scheduler = app.state.lm.scheduler
    if settings.scheduling_dir is not None:
        scheduler.hand_claims_to(SchedulingClient(settings.scheduling_dir))
    app.state.reload = lambda: (
        reload_tokens(app.state.tokens, settings),
        reload_certificate(settings),
        reload_policies(scheduler, settings),
    )
    return app


def _operations_router() -> APIRouter:
    router = APIRouter(tags=["operations"])

    # async: a liveness probe does no I/O, so no hop to the thread pool.
    @router.get("/healthz", response_model=HealthOut)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/metrics", response_class=Response)
    def metrics(metrics: MetricsDep) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router


def _openapi(app: FastAPI, *, secured: bool) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        if secured:
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}
            }
            schema["security"] = [{"bearer": []}]
            for path in OPEN_PATHS & set(schema["paths"]):
                for operation in schema["paths"][path].values():
                    operation["security"] = []
        app.openapi_schema = schema
    return app.openapi_schema
