"""Maintenance: drain a host (its VMs are placed elsewhere, the agents move them) and
follow the drain's progress on the host; evacuate a host that is down."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from loadmaster.api import views
from loadmaster.api.deps import LM
from loadmaster.api.responses import DrainOut, EvacuationOut, HostDetail
from loadmaster.api.schemas import DrainRequest, EvacuateRequest

router = APIRouter(tags=["maintenance"])


@router.get("/hosts/{host_name}", response_model=HostDetail)
def get_host(lm: LM, host_name: str) -> HostDetail:
    """The host as a provider, plus ``status`` (``draining`` while VMs are still on or
    headed to a host in maintenance) and the VMs left on it."""
    host = lm.hosts.get(host_name)
    if host.parent is not None:  # a child provider (a NUMA cell) is never drained itself
        return views.host_detail(host, host.state, None)
    drain = lm.maintenance.status(host.uuid)
    return views.host_detail(host, drain.status, drain.to_dict())


@router.post("/hosts/{host_name}/drain", response_model=DrainOut)
def drain_host(lm: LM, host_name: str, body: DrainRequest | None = None) -> dict[str, Any]:
    """Put the host in maintenance and place every VM on it elsewhere in one batch
    (running ones migrate, pending ones are re-placed). Draining again places what is
    left; ``force`` stops what fits nowhere. Lists the VMs that fit nowhere, with the
    scheduler's explanation."""
    force = body.force if body is not None else False
    return lm.maintenance.drain(host_name, force=force).to_dict()


@router.post("/hosts/{host_name}/evacuate", response_model=EvacuationOut)
def evacuate_host(lm: LM, host_name: str, body: EvacuateRequest | None = None) -> dict[str, Any]:
    """Start the VMs of a dead host elsewhere, highly available ones (tag ``ha``) first,
    through the scheduler (every filter, group rule and pending claim). The host must be
    known down: already ``down``, confirmed by ``confirm_down``, or fenced by the server's
    fence command; otherwise 409 and nothing changes (a host that is only silent may still
    run its VMs). Refused while the host's agent is heard from, unless ``force`` goes with
    ``confirm_down``. The host becomes ``down``
    and each VM's claim there ends as it is claimed elsewhere; a VM that fits nowhere
    keeps its claim there, for the next evacuation. Evacuating again places what is left.
    Migrations from or to the host are taken over (``taken_over``)."""
    body = body or EvacuateRequest()
    return lm.evacuation.evacuate(
        host_name, confirm_down=body.confirm_down, force=body.force
    ).to_dict()
