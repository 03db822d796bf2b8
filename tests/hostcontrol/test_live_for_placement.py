"""A host takes VMs only once its host manager holds its work list: a manager that has
just (re)started learns of a VM only at its first read, and an SLA loop's measurements
say nothing of that."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness import wait_until
from loadmaster.agent import runner
from loadmaster.api.app import create_app
from loadmaster.api.server import ThreadedServer, serve_in_thread
from loadmaster.apiclient import ApiError
from loadmaster.heartbeat import AGENT_RUN_HEADER
from loadmaster.scheduler import RequestSpec
from loadmaster.scheduler.core.filters.live_agent import UNLISTED
from loadmaster.service import Loadmaster

NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 16384}}


@pytest.fixture
def served(lm: Loadmaster) -> Iterator[ThreadedServer]:
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    server = serve_in_thread(create_app(lm))
    try:
        yield server
    finally:
        server.stop()


def _chosen(lm: Loadmaster, host: str) -> bool:
    (placement,) = lm.scheduler.schedule(
        [RequestSpec(flavor="small", include_hosts=[host])], dry_run=True
    ).placements
    return placement.host == host


def _why_not(lm: Loadmaster, host: str) -> dict[str, int]:
    explained = lm.scheduler.explain(RequestSpec(flavor="small", include_hosts=[host]))
    (live,) = [f for f in explained.filters if f.filter == "live_agent"]
    assert UNLISTED in explained.message
    return dict(live.reasons)


def test_a_host_whose_manager_never_read_its_list_is_not_chosen(
    lm: Loadmaster, served: ThreadedServer
) -> None:
    # The shipped agent's client: its registration, reports and reads say its run.
    agent = runner.ApiClient(served.url)
    try:
        for host in ("reporting", "holding"):
            agent.register(host, {"hypervisor_uri": f"test:///{host}", "inventories": NODE})
        agent.work("holding", -1, 0)
        # Its SLA loop reports, again and again; its manager never reads its list.
        for load in (0.1, 0.2, 0.3):
            agent.report("reporting", {"usage": {"cpu": load}, "load": {"cpu": load}})
        wait_until(lambda: _chosen(lm, "holding"), 30, "the host whose manager read its list")
        assert not _chosen(lm, "reporting")
        assert _why_not(lm, "reporting") == {UNLISTED: 1}

        agent.work("reporting", -1, 0)
        wait_until(lambda: _chosen(lm, "reporting"), 30, "the host after its first read")

        # The manager of "holding" restarts: a new run, which holds no list until it reads.
        agent.close()
        agent = runner.ApiClient(served.url, run="restarted")
        agent.register("holding", {"hypervisor_uri": "test:///holding", "inventories": NODE})
        wait_until(lambda: not _chosen(lm, "holding"), 30, "the restarted manager unchosen")
        assert _why_not(lm, "holding") == {UNLISTED: 1}
        agent.work("holding", -1, 0)
        wait_until(lambda: _chosen(lm, "holding"), 30, "the restarted manager's first read")
    finally:
        agent.close()


def test_a_malformed_run_is_refused_naming_the_header_and_changes_nothing(
    lm: Loadmaster, served: ThreadedServer
) -> None:
    agent = runner.ApiClient(served.url)
    try:
        agent.register("h0", {"hypervisor_uri": "test:///h0", "inventories": NODE})
        agent.work("h0", -1, 0)
        wait_until(lambda: _chosen(lm, "h0"), 30, "the host after its first read")
        # The long-poll is refused at once, not after its wait.
        for method, path, body, params in (
            ("PUT", "/hosts/h0/agent", {"hypervisor_uri": "test:///h0", "inventories": NODE}, {}),
            ("POST", "/hosts/h0/report", {"usage": {"cpu": 0.5}}, {}),
            ("GET", "/hosts/h0/work", None, {"after": 10**6, "wait": 60}),
        ):
            with pytest.raises(ApiError) as refused:
                agent.request(
                    method, path, body=body, params=params, headers={AGENT_RUN_HEADER: "no spaces"}
                )
            assert refused.value.status == 400
            assert refused.value.field == "header.loadmaster-agent-run"
        assert _chosen(lm, "h0")
    finally:
        agent.close()
