"""What a server process keeps for agents' long-polls stays bounded by the fleet, not by
what clients send."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from sqlalchemy import event

import loadmaster
from harness import wait_until
from loadmaster.api.app import create_app
from loadmaster.api.longpoll import PARAMETERS
from loadmaster.api.routes import agents
from loadmaster.api.server import ThreadedServer, serve_in_thread
from loadmaster.hostcontrol import HostWatch
from loadmaster.service import Loadmaster

NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}


@pytest.fixture
def sqlite_lm(tmp_path: Path) -> Iterator[Loadmaster]:
    service = loadmaster.open(f"sqlite:///{tmp_path / 'loadmaster.db'}")
    try:
        yield service
    finally:
        service.close()


def _spellings(uuid: str, count: int) -> list[str]:
    """``count`` spellings of ``uuid`` the store takes for it: hyphens anywhere, any case."""
    bare = uuid.replace("-", "")
    out = []
    for i in range(count):
        at = 1 + i % (len(bare) - 1)
        spelled = bare[:at] + "-" + bare[at:]
        out.append(spelled.upper() if i % 2 else spelled)
    return out


def test_every_spelling_of_a_hosts_uuid_is_one_cached_host(sqlite_lm: Loadmaster) -> None:
    """A client inventing spellings of a host's uuid costs neither a database read nor a
    cache entry each."""
    (host,) = sqlite_lm.hosts.create_many([{"name": "h0", "inventories": NODE}])
    spellings = _spellings(host.uuid, 60)
    assert len(set(spellings)) == 60
    watch = HostWatch(sqlite_lm.store, tick_s=60.0)
    reads: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        reads.append(statement)

    async def scenario() -> list[int]:
        await watch.start()
        try:
            event.listen(sqlite_lm.store.engine, "before_cursor_execute", count)
            try:
                return [(await watch.host(spelled)).id for spelled in spellings]
            finally:
                event.remove(sqlite_lm.store.engine, "before_cursor_execute", count)
        finally:
            await watch.stop()

    found = asyncio.run(scenario())
    assert set(found) == {found[0]}
    assert watch.cached_host(spellings[1]) == watch.cached_host("h0")
    assert reads == [], f"{len(reads)} statements for spellings of one cached host"


@pytest.fixture
def served(sqlite_lm: Loadmaster) -> Iterator[ThreadedServer]:
    sqlite_lm.hosts.create_many([{"name": "h0", "inventories": NODE}])
    server = serve_in_thread(create_app(sqlite_lm))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("query", "headers", "field"),
    [
        ("&bogus=1", {}, "query.bogus"),
        ("&x=%00", {}, "query.x"),
        ("&after=1%00", {}, "query.after"),
        ("", {"OpenStack-API-Version": "placement one"}, None),
        ("", {"Accept": "text/plain"}, "header.accept"),
    ],
)
def test_a_poll_the_stack_refuses_is_refused_at_once_not_after_its_wait(
    served: ThreadedServer, query: str, headers: dict[str, str], field: str | None
) -> None:
    started = time.monotonic()
    answer = httpx.get(
        f"{served.url}/hosts/h0/work?after=1000000&wait=60{query}", headers=headers, timeout=90
    )
    took = time.monotonic() - started
    assert answer.status_code == (406 if "Accept" in headers else 400), answer.text
    if field is not None:
        assert answer.json()["field"] == field
    assert took < 30, f"refused after {took:.0f} s: held for its wait first"


def test_the_polls_held_are_asked_with_the_work_routes_own_parameters() -> None:
    (route,) = [
        r
        for r in agents.router.routes
        if isinstance(r, APIRoute) and r.path == "/hosts/{host_name}/work"
    ]
    assert {param.alias for param in route.dependant.query_params} == PARAMETERS


def test_a_stopping_server_answers_every_held_poll_at_once(
    sqlite_lm: Loadmaster, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, each poll was held through the graceful shutdown's 3 s, then cancelled: a
    CancelledError traceback in the log and a 500 or a cut connection for the agent."""
    sqlite_lm.hosts.create_many([{"name": f"h{i}", "inventories": NODE} for i in range(2)])
    app = create_app(sqlite_lm)
    server = serve_in_thread(app)
    answers: list[tuple[int, float]] = []
    failures: list[BaseException] = []

    def poll(host: str, etag: bool) -> None:
        headers = {"If-None-Match": '"1000000"'} if etag else {}
        try:
            answer = httpx.get(
                f"{server.url}/hosts/{host}/work?after=1000000&wait=60",
                headers=headers,
                timeout=90,
            )
            answers.append((answer.status_code, time.monotonic()))
        except BaseException as exc:
            failures.append(exc)

    polls = [
        threading.Thread(target=poll, args=(f"h{i % 2}", i % 2 == 0), daemon=True)
        for i in range(10)
    ]
    try:
        for thread in polls:
            thread.start()
        wait_until(lambda: app.state.watch.waiting() == 10, 60, "10 polls held")
        with caplog.at_level(logging.INFO):
            stopping = time.monotonic()
            server.stop(timeout=30)
            for thread in polls:
                thread.join(timeout=30)
    finally:
        server.stop()
    assert failures == []
    assert sorted(status for status, _ in answers) == [200] * 5 + [304] * 5
    slowest = max(at for _, at in answers) - stopping
    assert slowest < 2.0, f"the last held poll was answered {slowest:.1f} s into the stop"
    assert not [r for r in caplog.records if r.exc_info or "Cancel" in r.getMessage()]


def test_a_stopped_watch_ends_every_hold(sqlite_lm: Loadmaster) -> None:
    sqlite_lm.hosts.create_many([{"name": "h0", "inventories": NODE}])
    watch = HostWatch(sqlite_lm.store, tick_s=60.0)

    async def scenario() -> str:
        await watch.start()
        host = await watch.host("h0")
        never = asyncio.get_running_loop().create_future
        holding = asyncio.create_task(watch.hold(host.id, 10**6, 60.0, never))
        while watch.waiting() == 0:
            await asyncio.sleep(0.01)
        await watch.stop()
        return await asyncio.wait_for(holding, 10.0)

    assert asyncio.run(scenario()) == "timeout"
