"""Scheduling: place VMs (or ask where they would go), explain, capacity, policies."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from loadmaster.api.deps import LM, MetricsDep
from loadmaster.api.schemas import RequestSpecIn, ScheduleIn
from loadmaster.scheduler import RequestSpec

router = APIRouter(tags=["scheduling"])


@router.post("/schedule")
def schedule(lm: LM, metrics: MetricsDep, body: ScheduleIn) -> dict[str, Any]:
    """Place existing VMs (``vms``), or with ``dry_run`` also hypothetical ones
    (``flavor`` + ``count``). Per-VM failures come back in ``placements`` with their
    explanation; ``gang`` places all or none."""
    requests = [RequestSpec(**r.fields()) for r in body.requests]
    result = lm.scheduler.schedule(
        requests, gang=body.gang, dry_run=body.dry_run, policy=body.policy
    )
    metrics.observe_schedule(result)
    return result.to_dict()


@router.post("/schedule/explain")
def explain(lm: LM, body: RequestSpecIn) -> dict[str, Any]:
    """Why each host would be ruled out for the request's first VM, right now."""
    return lm.scheduler.explain(RequestSpec(**body.fields())).to_dict()


@router.get("/capacity")
def capacity(
    lm: LM, flavor: str, group: str | None = None, policy: str | None = None
) -> dict[str, Any]:
    """How many more VMs of ``flavor`` fit now (pending counted as used), best hosts first."""
    return lm.scheduler.capacity(flavor, group=group, policy=policy).to_dict()


@router.get("/policies")
def policies(lm: LM) -> dict[str, Any]:
    return {
        "default": lm.scheduler.default_policy,
        "policies": [p.to_dict() for p in lm.scheduler.policies.values()],
    }
