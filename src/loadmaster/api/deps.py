"""What routes receive: the ``Loadmaster`` the app was built on, its metrics, and the
batcher that writes concurrent VM creates together (``batching.py``).

The dependencies are ``async``: FastAPI runs a plain ``def`` one in its thread pool, a
round trip through another thread for two attribute reads."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from loadmaster.api.batching import Batcher
from loadmaster.api.observability import Metrics
from loadmaster.cluster import VmRecord, VmSpec
from loadmaster.service import Loadmaster

VmCreator = Batcher[VmSpec, VmRecord]


async def _loadmaster(request: Request) -> Loadmaster:
    lm: Loadmaster = request.app.state.lm
    return lm


async def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def _vm_creates(request: Request) -> VmCreator:
    creates: VmCreator = request.app.state.vm_creates
    return creates


LM = Annotated[Loadmaster, Depends(_loadmaster)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
VmCreates = Annotated[VmCreator, Depends(_vm_creates)]
