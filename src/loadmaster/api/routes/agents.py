"""Host agents: registration, the work list (long-polled), reports and failures.

An agent's token (role ``agent:<host>``) is bound to its host: the middleware lets it
write only under ``/hosts/<its host>/`` and to a VM's ``up``, ``launch-failed``,
``migration-failed`` and ``migrate``; these routes check that the VM is on its host.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from loadmaster.api import views
from loadmaster.api.deps import LM
from loadmaster.api.direct import inline_when
from loadmaster.api.errors import Forbidden
from loadmaster.api.longpoll import MAX_AFTER, MAX_WAIT_S
from loadmaster.api.responses import (
    AgentOut,
    HostFailureOut,
    ReconcileOut,
    RegistrationOut,
    WorkListOut,
)
from loadmaster.api.schemas import AgentRegistration, HostFailure, HostReport
from loadmaster.errors import ValidationError
from loadmaster.heartbeat import AGENT_HEADER, AGENT_RUN_HEADER, polls_as_agent, valid_run
from loadmaster.hostcontrol import HostWatch, WorkList
from loadmaster.service import Loadmaster

router = APIRouter(tags=["host agents"])


def agent_host(request: Request) -> str | None:
    """The host the caller's token is bound to; None for an admin (or without auth)."""
    host: str | None = getattr(request.state, "agent_host", None)
    return host


def check_vm_of_agent(lm: Loadmaster, request: Request, vm: str) -> None:
    """An agent may act on a VM only if the VM is on its host or headed there."""
    host = agent_host(request)
    if host is None:
        return
    record = lm.vms.get(vm)
    if host not in (record.host, record.target_host):
        raise Forbidden(f"VM {vm} is not on host {host}; its agent may not act on it")


def _polls_as_agent(request: Request, host: str) -> bool:
    """Whether the caller's poll counts as hearing from the host's agent
    (``heartbeat.polls_as_agent``); a reader watching a work list never does."""
    bound = agent_host(request)
    if bound is None and getattr(request.state, "role", "admin") != "admin":
        return False
    return polls_as_agent(bound, host, request.headers.get(AGENT_HEADER))


def _run(request: Request) -> str | None:
    """The run the caller says it is of the host's agent (``AGENT_RUN_HEADER``)."""
    run = request.headers.get(AGENT_RUN_HEADER)
    if run is not None and not valid_run(run):
        raise ValidationError(
            f"header {AGENT_RUN_HEADER} must be 1 to 64 letters, digits, '-' or '_'",
            field=f"header.{AGENT_RUN_HEADER.lower()}",
        )
    return run


def _check_host_of_agent(request: Request, host: str) -> None:
    bound = agent_host(request)
    if bound is not None and bound != host:
        raise Forbidden(f"the agent of host {bound} may not act for host {host}")


@router.put("/hosts/{host_name}/agent", response_model=RegistrationOut)
def register(lm: LM, request: Request, host_name: str, body: AgentRegistration) -> dict[str, Any]:
    """Register the host (created if new, found by name otherwise) with the inventories its
    agent discovered; a class that would shrink below its allocations keeps its old
    inventory and is listed under ``refused``; a child provider named after the host that
    the agent no longer lists (a device gone) is listed under ``withdrawn``. A host on a
    shared pool joins its sharing provider's aggregate (made with it on the first
    registration that names it); one that names none leaves it."""
    _check_host_of_agent(request, host_name)
    fields = body.model_dump()
    registration = lm.host_agents.register(
        host_name,
        run=_run(request),
        hypervisor_uri=fields["hypervisor_uri"],
        inventories=fields["inventories"],
        children=fields["children"],
        child_traits=fields["child_traits"],
        child_parents=fields["child_parents"],
        shared_pool=fields["shared_pool"],
    )
    return {
        "host": views.host(registration.host),
        "refused": dict(registration.refused),
        "withdrawn": list(registration.withdrawn),
        "agent": lm.host_agents.status(host_name).to_dict(),
    }


@router.get("/hosts/{host_name}/agent", response_model=AgentOut)
def agent_status(lm: LM, host_name: str) -> dict[str, Any]:
    """``status``: ``none``, ``ok`` or ``silent`` (not heard from for a while: its claims
    are kept, not dropped; an operator has to look)."""
    return lm.host_agents.status(host_name).to_dict()


@router.get(
    "/hosts/{host_name}/work",
    response_model=WorkListOut,
    responses={304: {"description": "the wait ended with the generation still ``after``"}},
)
async def work(
    request: Request,
    response: Response,
    host_name: str,
    after: Annotated[int, Query(ge=-1, le=MAX_AFTER, description="generation already seen")] = -1,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="seconds to wait")] = 0.0,
) -> Any:
    """Every VM the ledger puts on the host and what its agent must do about it, once the
    host's generation is past ``after`` (or ``wait`` seconds passed: then the list as it
    is, or 304 with no body if the request says ``If-None-Match: "<after>"``: the
    agent's list is still the one it has). An agent that read generation G knows every
    claim stamped G or before; the answer's ``ETag`` is ``"G"``.

    Waiting costs the server a connection and nothing else: the request is held in front
    of the middleware stack (``api/longpoll.py``) until the process's ``HostWatch`` says
    the host may have changed or the wait ran out, and a client that hangs up ends it at
    once. Here, the wait is over."""
    watch: HostWatch = request.app.state.watch
    run = _run(request)
    host = await watch.host(host_name)
    agent = _polls_as_agent(request, host.name)
    if agent:
        watch.heard(host.id)
    work_list = None
    if watch.maybe_newer(host.id, after):
        work_list = await watch.work_list(host)
    if work_list is None or work_list.generation <= after:
        if request.headers.get("if-none-match") == _etag(after):
            if agent and run is not None:
                watch.ran(host.id, run, listed=True)  # the list it holds is current
            return Response(status_code=304, headers={"ETag": _etag(after)})
        work_list = work_list or await watch.work_list(host)
    if agent and run is not None:
        watch.ran(host.id, run, listed=True)
    return _answer(response, work_list)


def _answer(response: Response, work_list: WorkList) -> dict[str, Any]:
    response.headers["ETag"] = _etag(work_list.generation)
    return work_list.to_dict()


def _etag(generation: int) -> str:
    return f'"{generation}"'


def _in_memory(arguments: dict[str, Any]) -> bool:
    """A report the service keeps in memory (``HostAgents.keeps_in_memory``): answered
    without a thread."""
    lm: Loadmaster = arguments["lm"]
    return lm.host_agents.keeps_in_memory(arguments["host_name"], arguments["body"].running_vms)


@router.post("/hosts/{host_name}/report", response_model=ReconcileOut)
@inline_when(_in_memory)
def host_report(lm: LM, request: Request, host_name: str, body: HostReport) -> dict[str, Any]:
    """An agent's report: measurements for the load weigher, then the ledger is reconciled
    with the VMs the host runs (pending ones seen there become active; see
    ``Ledger.reconcile`` for which missing VMs count as ended)."""
    _check_host_of_agent(request, host_name)
    run = _run(request)
    result = lm.host_agents.report(
        host_name,
        body.running_vms,
        launching=body.launching,
        seen_generation=body.seen_generation,
        as_of=body.as_of,
        usage=body.usage,
        load=body.load,
    )
    watch: HostWatch = request.app.state.watch
    host = watch.cached_host(host_name)
    if run is not None and host is not None:
        # A report says the run lives, never that it holds the host's list.
        watch.ran(host.id, run)
    return views.reconcile(result)


@router.post("/vms/{uuid}/launch-failed", tags=["vms"], response_model=HostFailureOut)
def launch_failed(lm: LM, request: Request, uuid: str, body: HostFailure) -> dict[str, Any]:
    """The host refused the VM or could not start it: the claim goes and the VM is placed
    again, excluding every host that gave it up, while attempts are left. The reason is
    kept on the VM (``fault``)."""
    check_vm_of_agent(lm, request, uuid)
    _check_host_of_agent(request, body.host)
    outcome = lm.host_agents.launch_failed(uuid, body.host, body.reason)
    return {
        "vm": views.vm(outcome.vm),
        "ended": outcome.kind,
        "placement": outcome.placement.to_dict() if outcome.placement else None,
    }


@router.post("/vms/{uuid}/migration-failed", tags=["vms"], response_model=HostFailureOut)
def migration_failed(lm: LM, request: Request, uuid: str, body: HostFailure) -> dict[str, Any]:
    """A migration failed: the destination's claim goes, the VM keeps running on its
    source. Saying it again is harmless."""
    check_vm_of_agent(lm, request, uuid)
    _check_host_of_agent(request, body.host)
    outcome = lm.host_agents.migration_failed(uuid, body.host, body.reason)
    return {"vm": views.vm(outcome.vm), "ended": outcome.kind}
