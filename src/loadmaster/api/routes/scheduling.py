"""Scheduling: place VMs (or ask where they would go), explain, capacity, policies."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from loadmaster.api.deps import LM, MetricsDep
from loadmaster.api.responses import CapacityOut, ExplanationOut, PolicyList, ScheduleOut
from loadmaster.api.schemas import ScheduleIn
from loadmaster.scheduler import RequestSpec

router = APIRouter(tags=["scheduling"])


@router.post("/schedule", response_model=ScheduleOut)
def schedule(lm: LM, metrics: MetricsDep, body: ScheduleIn) -> dict[str, Any]:
    """Place existing VMs (``vms``), or with ``dry_run`` also hypothetical ones
    (``flavor`` + ``count``). Per-VM failures come back in ``placements`` with their
    explanation; ``gang`` places all or none. The answer's ``seed`` given again on the same
    state makes the same choices (dry run or not)."""
    result = lm.scheduler.schedule(
        body.requests, gang=body.gang, dry_run=body.dry_run, policy=body.policy, seed=body.seed
    )
    metrics.observe_schedule(result)
    return result.to_dict()


@router.post("/schedule/explain", response_model=ExplanationOut)
def explain(
    lm: LM,
    body: RequestSpec,
    policy: Annotated[str | None, Query(min_length=1, max_length=255)] = None,
    seed: Annotated[int, Query(ge=0, le=2**63 - 1)] | None = None,
) -> dict[str, Any]:
    """Why hosts are ruled out for the request, right now: the first VM a dry run with
    ``policy`` and ``seed`` would fail to place (explained as that run's failure), else the
    first VM with how many hosts fit it."""
    return lm.scheduler.explain(body, policy=policy, seed=seed).to_dict()


@router.get("/capacity", response_model=CapacityOut)
def capacity(
    lm: LM, flavor: str, group: str | None = None, policy: str | None = None
) -> dict[str, Any]:
    """How many more VMs of ``flavor`` fit now (pending counted as used), best hosts first."""
    return lm.scheduler.capacity(flavor, group=group, policy=policy).to_dict()


@router.get("/policies", response_model=PolicyList)
def policies(lm: LM) -> dict[str, Any]:
    return {
        "default": lm.scheduler.default_policy,
        "policies": [p.to_dict() for p in lm.scheduler.policies.values()],
    }
