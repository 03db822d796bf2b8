"""Request ids, one structured log line per request, and Prometheus metrics.

Metrics live in a registry per app (not the process-global one), so several apps in one
process (tests, a CLI running a server in a thread) never collide. The pending-records
gauge is read from the store at scrape time: the ledger keeps no counters to read.
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import time
import uuid
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loadmaster.hostcontrol import HostWatch
from loadmaster.logs import JsonFormatter as BaseJsonFormatter
from loadmaster.logs import log_to_stream
from loadmaster.runtime import GcPauses, gc_pauses
from loadmaster.scheduler import ScheduleResult
from loadmaster.service import Loadmaster

REQUEST_ID_HEADER = "x-request-id"
# The id is echoed under loadmaster's header and under OpenStack's two.
ECHOED_AS = (REQUEST_ID_HEADER, "openstack-request-id", "x-openstack-request-id")
_REQUEST_ID_BYTES = REQUEST_ID_HEADER.encode()
_ECHOED_BYTES = tuple(name.encode() for name in ECHOED_AS)
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "loadmaster_request_id", default=None
)
access_log = logging.getLogger("loadmaster.api.access")


class JsonFormatter(BaseJsonFormatter):
    """One JSON object per line, with the id of the request it was written for."""

    def entry(self, record: logging.LogRecord) -> dict[str, Any]:
        entry = super().entry(record)
        request_id = request_id_var.get()
        if request_id is not None:
            entry["request_id"] = request_id
        return entry


def configure_logging(level: int = logging.INFO) -> None:
    log_to_stream(sys.stderr, "json", level).setFormatter(JsonFormatter())


class _PendingRecords(Collector):
    def __init__(self, lm: Loadmaster) -> None:
        self._lm = lm

    def collect(self) -> Iterable[GaugeMetricFamily]:
        per_host: dict[str, int] = {}
        for record in self._lm.allocations.allocations(state="pending"):
            per_host[record.host] = per_host.get(record.host, 0) + 1
        total = GaugeMetricFamily(
            "loadmaster_pending_records",
            "Pending allocation records (VMs placed, not yet reported up)",
        )
        total.add_metric([], sum(per_host.values()))
        by_host = GaugeMetricFamily(
            "loadmaster_host_pending_records",
            "Pending allocation records per host",
            labels=["host"],
        )
        for host, count in sorted(per_host.items()):
            by_host.add_metric([host], count)
        return [total, by_host]


class _WaitingPolls(Collector):
    def __init__(self, watch: HostWatch) -> None:
        self._watch = watch

    def collect(self) -> Iterable[GaugeMetricFamily]:
        waiting = GaugeMetricFamily(
            "loadmaster_agent_polls_waiting",
            "Host agents' long-polls this process holds open now (after a restart: how many "
            "agents are back in their wait)",
        )
        waiting.add_metric([], self._watch.waiting())
        return [waiting]


class _GcPauses(Collector):
    def __init__(self, pauses: GcPauses) -> None:
        self._pauses = pauses

    def collect(self) -> Iterable[GaugeMetricFamily | HistogramMetricFamily]:
        pauses = self._pauses
        within = list(pauses.within)  # counted on by any thread meanwhile
        histogram = HistogramMetricFamily(
            "loadmaster_gc_pause_seconds",
            "The garbage collector's pauses in this server process",
        )
        histogram.add_metric(
            [],
            [
                *((str(b), float(n)) for b, n in zip(GcPauses.BUCKETS, within, strict=True)),
                ("+Inf", float(pauses.count)),
            ],
            pauses.total_s,
        )
        longest = GaugeMetricFamily(
            "loadmaster_gc_pause_longest_seconds",
            "The longest pause of the garbage collector in this server process",
        )
        longest.add_metric([], pauses.longest_s)
        return [histogram, longest]


class Metrics:
    def __init__(self, lm: Loadmaster, watch: HostWatch) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "loadmaster_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "loadmaster_http_request_seconds",
            "HTTP request duration",
            ["route"],
            registry=self.registry,
        )
        self.placements = Counter(
            "loadmaster_placements",
            "VM placement outcomes (dry runs excluded)",
            ["outcome"],
            registry=self.registry,
        )
        self.conflicts = Counter(
            "loadmaster_conflicts",
            "Lost generation races and 409 answers",
            ["source"],
            registry=self.registry,
        )
        self.retries = Counter(
            "loadmaster_schedule_retries",
            "Extra decisions made after a VM lost a claim race",
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "loadmaster_decision_seconds",
            "Time to choose a host for one VM",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=self.registry,
        )
        self.registry.register(_PendingRecords(lm))
        self.registry.register(_WaitingPolls(watch))
        self.registry.register(_GcPauses(gc_pauses()))
        # Each series' child, looked up once: ``labels()`` takes a lock and builds a key
        # on every call, and every request counts in two series.
        self._series: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def answered(self, template: str, method: str, status: int, seconds: float) -> None:
        """One answered request: counted by route template, method and status, timed by
        route template; a 409 also counts as a conflict."""
        key = (template, method, status)
        series = self._series.get(key)
        if series is None:
            series = (
                self.requests.labels(template, method, str(status)),
                self.request_seconds.labels(template),
            )
            self._series[key] = series
        series[0].inc()
        series[1].observe(seconds)
        if status == 409:
            self.conflicts.labels("http_409").inc()

    def observe_schedule(self, result: ScheduleResult) -> None:
        for placement in result.placements:
            self.decision_seconds.observe(placement.decision_seconds)
            if placement.attempts > 1:
                self.retries.inc(placement.attempts - 1)
            if not result.dry_run:
                self.placements.labels("placed" if placement.ok else "failed").inc()
        if result.conflicts:
            self.conflicts.labels("claim_race").inc(result.conflicts)


def request_id_of(scope: Scope) -> str:
    """The client's ``X-Request-ID`` if sane, else a new id in OpenStack's form, which its
    clients and logs expect."""
    given = b""
    for name, value in scope["headers"]:
        if name == _REQUEST_ID_BYTES:
            given = value
    text = given.decode("latin-1")
    return text if _SAFE_ID.match(text) else f"req-{uuid.uuid4()}"


def id_headers(request_id: str) -> list[tuple[bytes, bytes]]:
    """The request id under each name it is echoed as."""
    value = request_id.encode()
    return [(name, value) for name in _ECHOED_BYTES]


def record_request(
    metrics: Metrics, scope: Scope, template: str, status: int, seconds: float
) -> None:
    """Count, time and log one answered request (by route template, not raw path, which
    would make a metric series per VM)."""
    metrics.answered(template, scope["method"], status, seconds)
    access_log.info(
        "%s %s %s",
        scope["method"],
        scope["path"],
        status,
        extra={
            "fields": {
                "method": scope["method"],
                "path": scope["path"],
                "route": template,
                "status": status,
                "ms": round(seconds * 1000, 2),
            }
        },
    )


class RequestContextMiddleware:
    """Gives every request an id (the client's ``X-Request-ID`` if sane, else a new one),
    echoes it, logs the outcome and counts it by route template."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), *id_headers(request_id)]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            record_request(self.metrics, scope, template, status, time.perf_counter() - started)
            request_id_var.reset(token)
