"""A fleet whose agents all start together gets its work lists in seconds: a host that
has not moved since the server last read its list (an empty one above all) is answered
from memory, the others are read many hosts to a statement, and an agent turned away
is given a turn at which there is room for it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import event

from fleet_agents import Connection
from loadmaster.api.app import create_app
from loadmaster.api.server import serve_in_thread
from loadmaster.heartbeat import AGENT_HEADER
from loadmaster.hostcontrol import watch as host_watch
from loadmaster.pending.claims import Claim
from loadmaster.service import Loadmaster

NODE = {"VCPU": {"total": 64}, "MEMORY_MB": {"total": 262144}}
HOSTS = 2200
# One host in this many has a VM on it: its list is read from the database.
BUSY_EVERY = 4
# Hosts whose lists may wait for a batch read here: small enough that the fleet's first
# reads overflow it and agents are turned away.
QUEUED = 16


@dataclass
class FirstReads:
    """What a fleet of fresh agents got: each one's list, and how often it was refused."""

    lists: dict[str, list[str]] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)


class Counted:
    """Statements sent by anything but the watcher's own tick (which reads the clock on
    its own schedule, whatever the fleet does)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_args: Any) -> None:
        if threading.current_thread().name != "host-watch":
            self.count += 1


@pytest.fixture
def on_host(lm: Loadmaster, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The hosts, one in ``BUSY_EVERY`` with a VM claimed on it: the VM by host."""
    monkeypatch.setattr(host_watch, "MAX_QUEUED_READS", QUEUED)
    lm.hosts.create_many([{"name": f"h{i}", "inventories": NODE} for i in range(HOSTS)])
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    busy = [f"h{i}" for i in range(0, HOSTS, BUSY_EVERY)]
    vms = [lm.vms.create(f"v{host}", "small") for host in busy]
    lm.allocations.claim_many([Claim(vm.uuid, host) for vm, host in zip(vms, busy, strict=True)])
    return {host: vm.uuid for vm, host in zip(vms, busy, strict=True)}


async def _first_read(url: str, host: str, into: FirstReads) -> None:
    """As the shipped host manager starts: ``after=-1`` with a long wait, and on a 503
    back at the turn the server gave (``Retry-After``)."""
    connection = Connection(url, None)
    try:
        while True:
            status, headers, body = await connection.request(
                "GET",
                f"/hosts/{host}/work?after=-1&wait=100",
                headers={AGENT_HEADER: host},
                timeout=120,
            )
            if status != 503:
                break
            into.refused[host] += 1
            await asyncio.sleep(float(headers["retry-after"]))
        if status != 200:
            into.failed.append(f"{host}: {status} {body[:200]!r}")
            return
        into.lists[host] = [item["vm"] for item in json.loads(body)["items"]]
    finally:
        connection.close()


def _start_together(lm: Loadmaster, hosts: list[str]) -> tuple[FirstReads, int]:
    """A server just started, and every host's agent reading its list at once: what they
    got and the statements the server ran meanwhile."""
    into = FirstReads()
    counted = Counted()
    server = serve_in_thread(create_app(lm))
    event.listen(lm.store.engine, "before_cursor_execute", counted)
    try:

        async def fleet() -> None:
            await asyncio.gather(*(_first_read(server.url, host, into) for host in hosts))

        asyncio.run(fleet())
    finally:
        event.remove(lm.store.engine, "before_cursor_execute", counted)
        server.stop()
    return into, counted.count


def test_two_thousand_fresh_agents_get_their_lists_in_few_statements(
    lm: Loadmaster, on_host: dict[str, str]
) -> None:
    few_hosts = [f"h{i}" for i in range(200)]
    many_hosts = [f"h{i}" for i in range(200, HOSTS)]
    few, few_statements = _start_together(lm, few_hosts)
    many, many_statements = _start_together(lm, many_hosts)
    for got, hosts in ((few, few_hosts), (many, many_hosts)):
        assert got.failed == []
        assert got.lists == {h: [on_host[h]] if h in on_host else [] for h in hosts}
        worst = got.refused.most_common(1)
        assert not worst or worst[0][1] <= 3, f"{worst[0][0]} turned away {worst[0][1]} times"
    assert sum(many.refused.values()) > 0, "the fleet never overflowed the queue: no turns tried"
    # One transaction of a few statements per host made it linear: ten times the agents,
    # ten times the statements. Read in batches and from memory, far fewer.
    assert many_statements < 3 * max(few_statements, 10), (
        f"{few_statements} statements for 200 agents, {many_statements} for 2,000"
    )
