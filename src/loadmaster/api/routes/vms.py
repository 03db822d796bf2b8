"""VMs and their lifecycle: create, start (schedule + pending claim), up (activate),
stop, migrate, delete; and their claims (``/vms/{uuid}/allocations``; Placement's ``/allocations`` is in allocations.py)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Query, Request, Response

from loadmaster.api import views
from loadmaster.api.deps import LM, MetricsDep, VmCreates
from loadmaster.api.errors import Forbidden
from loadmaster.api.observability import Metrics
from loadmaster.api.responses import (
    HostUsages,
    ScheduledVm,
    VmAllocations,
    VmDetail,
    VmDevicesOut,
    VmList,
    VmOut,
)
from loadmaster.api.routes.agents import check_vm_of_agent
from loadmaster.api.schemas import Claim, VmMigrate, VmStart, VmTags, VmUp
from loadmaster.cluster import VmSpec
from loadmaster.errors import ValidationError
from loadmaster.hostcontrol.devices import parse_given
from loadmaster.scheduler import ScheduleResult
from loadmaster.service import Loadmaster

router = APIRouter()
log = logging.getLogger("loadmaster.api.vms")
VM = "/vms/{uuid}"


@router.get("/vms", tags=["vms"], response_model=VmList)
def list_vms(
    lm: LM,
    state: str | None = None,
    host: str | None = None,
    project_id: str | None = None,
    group: str | None = None,
    name: str | None = Query(None, description="only the VMs of this name"),
    tag: str | None = Query(None, description="only the VMs carrying this tag"),
    incoming: bool = Query(False, description="with host: also the VMs migrating to it"),
    limit: int | None = Query(None, ge=0, description="at most this many VMs"),
    offset: int = Query(0, ge=0, description="skip this many first (oldest first)"),
) -> dict[str, Any]:
    vms = lm.vms.list(
        state=state,
        host=host,
        project_id=project_id,
        group=group,
        name=name,
        tag=tag,
        incoming=incoming,
        limit=limit,
        offset=offset,
    )
    waiting = lm.waiting.find(vms=[v.uuid for v in vms if v.state in ("pending", "migrating")])
    return {"vms": [views.vm(v) for v in vms], "warnings": [w.warning for w in waiting]}


@router.post("/vms", status_code=201, tags=["vms"], response_model=VmOut)
def create_vm(creates: VmCreates, body: VmSpec) -> VmOut:
    """Created ``requested``: it holds nothing until started."""
    # Written together with the creates that arrive meanwhile (api/batching.py).
    return views.vm(creates(body))


@router.get(VM, tags=["vms"], response_model=VmDetail)
def get_vm(lm: LM, uuid: str) -> VmDetail:
    """``host_agent``: ``ok``, ``silent`` (its host's agent has not been heard from for a
    while; the VM's claim is kept) or ``none``; null when it is on no host."""
    vm = lm.vms.get(uuid)
    agent = lm.host_agents.status(vm.host).status if vm.host else None
    return views.vm_detail(vm, agent)


@router.put(VM + "/tags", tags=["vms"], response_model=VmOut)
def set_vm_tags(lm: LM, uuid: str, body: VmTags) -> VmOut:
    """Replace the VM's tags (its SLA tier and priority among them). Its host's agent
    writes them into the domain's metadata, where the SLA policy reads them, within a
    cycle."""
    return views.vm(lm.vms.set_tags(uuid, body.tags))


@router.delete(VM, status_code=204, tags=["vms"])
def delete_vm(lm: LM, uuid: str) -> Response:
    """Releases whatever it holds; deleting again is harmless."""
    lm.allocations.delete(uuid)
    return Response(status_code=204)


def _scheduled(
    lm: Loadmaster, metrics: Metrics, uuid: str, result: ScheduleResult
) -> dict[str, Any]:
    metrics.observe_schedule(result)
    placement = result.placements[0]
    if placement.error is not None:
        raise placement.error
    return {
        "vm": views.vm(lm.vms.get(uuid)),
        "placement": placement.to_dict(),
        "seed": result.seed,
    }


@router.post(VM + "/start", tags=["vms"], response_model=ScheduledVm)
def start_vm(
    lm: LM, metrics: MetricsDep, request: Request, uuid: str, body: VmStart | None = None
) -> dict[str, Any]:
    """Choose a host (or take ``host``, admin only, still judged by every other filter)
    and claim there: the VM becomes ``pending`` until it is reported up.
    No host: 409 ``loadmaster.no_valid_host`` with the per-filter ``explanation``.
    A VM that already runs: 409 ``loadmaster.invalid_transition`` (migrate moves it)."""
    host, policy = (body.host, body.policy) if body else (None, None)
    if host is not None and getattr(request.state, "role", "admin") != "admin":
        raise Forbidden("only an admin may choose the host a VM starts on")
    result = lm.scheduler.start(uuid, host=host, policy=policy)
    return _scheduled(lm, metrics, uuid, result)


@router.post(VM + "/up", tags=["vms"], response_model=VmOut)
def vm_up(lm: LM, request: Request, uuid: str, body: VmUp | None = None) -> VmOut:
    """The VM runs: its pending records become active (a migration completes). With
    ``host`` (agents send it) the claim must be on that host, else 409: a VM whose claim
    moved elsewhere meanwhile cannot come up where it no longer belongs."""
    check_vm_of_agent(lm, request, uuid)
    given = None
    if body is not None and body.devices is not None:
        if body.host is None:
            raise ValidationError("devices are said with the host they are on", field="host")
        given = parse_given(body.model_dump()["devices"])
    if given is not None and body is not None and body.host is not None:
        return views.vm(lm.devices.up(uuid, body.host, given))
    return views.vm(lm.allocations.activate(uuid, body.host if body else None))


@router.get(VM + "/devices", tags=["vms"], response_model=VmDevicesOut)
def vm_devices(lm: LM, uuid: str) -> dict[str, Any]:
    """The host devices the VM holds (PCI address, mediated device), as its agent gave
    them, under the providers its claim holds."""
    return {"devices": [d.to_dict() for d in lm.devices.of_vm(uuid)]}


@router.post(VM + "/stop", tags=["vms"], response_model=VmOut)
def stop_vm(lm: LM, uuid: str) -> VmOut:
    return views.vm(lm.allocations.stop(uuid))


@router.post(VM + "/migrate", tags=["vms"], response_model=ScheduledVm)
def migrate_vm(
    lm: LM, metrics: MetricsDep, request: Request, uuid: str, body: VmMigrate
) -> dict[str, Any]:
    """Claim a destination (``host``, judged by every filter as a pinned start is, or one
    the scheduler picks) while the source stays active; the source's agent moves the VM,
    ``/up`` completes the move and ``/migration-failed`` (or
    ``DELETE /vms/{uuid}/allocations?host=dest``) aborts it."""
    check_vm_of_agent(lm, request, uuid)
    # Only a running VM migrates: the ledger checks it under the VM's row lock.
    log.info("migration of %s requested: %s", uuid, body.reason or "no reason given")
    result = lm.scheduler.migrate(uuid, host=body.host, policy=body.policy)
    return _scheduled(lm, metrics, uuid, result)


def _allocations(lm: Loadmaster, uuid: str) -> dict[str, Any]:
    vm = lm.vms.get(uuid)
    records = lm.allocations.allocations(vm=uuid)
    hosts = {name: lm.hosts.get(name) for name in {r.host for r in records}}
    return {
        "allocations": views.allocations(records, hosts),
        "project_id": vm.project_id,
        "user_id": vm.user_id,
        "state": vm.state,
    }


@router.get(VM + "/allocations", tags=["vms"], response_model=VmAllocations)
def get_allocations(lm: LM, uuid: str) -> dict[str, Any]:
    return _allocations(lm, uuid)


@router.put(VM + "/allocations", tags=["vms"], response_model=VmAllocations)
def claim(lm: LM, uuid: str, body: Claim) -> dict[str, Any]:
    """Claim on a named host without the scheduler (pending records, all classes or
    none). With ``resource_provider_generation`` it lands only if the host is unchanged."""
    lm.allocations.claim(uuid, body.host, expected_generation=body.resource_provider_generation)
    return _allocations(lm, uuid)


@router.delete(VM + "/allocations", status_code=204, tags=["vms"])
def release(
    lm: LM, uuid: str, host: str | None = Query(None, description="release only this host's")
) -> Response:
    """Idempotent: releasing what is already gone is a no-op."""
    lm.allocations.release(uuid, host)
    return Response(status_code=204)


@router.get("/usages/hosts", tags=["allocations"], response_model=HostUsages)
def host_usages(lm: LM) -> dict[str, Any]:
    """Every host's capacity, active, pending, used and free per class."""
    return {"hosts": {name: views.usage(u) for name, u in sorted(lm.allocations.usages().items())}}
