"""What a server process keeps for agents' long-polls stays bounded by the fleet, not by
what clients send."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event

import loadmaster
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
