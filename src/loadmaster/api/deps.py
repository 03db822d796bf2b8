"""What routes receive: the ``Loadmaster`` the app was built on, and its metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from loadmaster.api.observability import Metrics
from loadmaster.service import Loadmaster


def _loadmaster(request: Request) -> Loadmaster:
    lm: Loadmaster = request.app.state.lm
    return lm


def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


LM = Annotated[Loadmaster, Depends(_loadmaster)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
