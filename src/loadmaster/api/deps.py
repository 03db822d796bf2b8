"""What routes receive: the ``Loadmaster`` the app was built on, and its metrics.

The dependencies are ``async``: FastAPI runs a plain ``def`` one in its thread pool, a
round trip through another thread for two attribute reads."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from loadmaster.api.observability import Metrics
from loadmaster.service import Loadmaster


async def _loadmaster(request: Request) -> Loadmaster:
    lm: Loadmaster = request.app.state.lm
    return lm


async def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


LM = Annotated[Loadmaster, Depends(_loadmaster)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
