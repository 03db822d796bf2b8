"""PostgreSQL goes away and comes back: calls fail with StoreUnavailable (HTTP 503), nothing
is half written, and the same Loadmaster object works again without a restart."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import loadmaster
from loadmaster.api.errors import status_of
from loadmaster.errors import StoreUnavailable
from loadmaster.pending import audit
from loadmaster.store.engine import IDLE_PING_S

ROOT = Path(__file__).resolve().parents[2]
PG = ["bash", str(ROOT / "scripts/postgres.sh")]


@pytest.fixture
def own_server() -> Iterator[tuple[str, str]]:
    """A private server: this test stops it, so it must not be the shared one."""
    pgdir = tempfile.mkdtemp(prefix="loadmaster-restart-")
    port = 40000 + (hash(pgdir) % 10000)
    url = subprocess.check_output([*PG, "start", pgdir, str(port)], text=True).strip()
    try:
        yield url, pgdir
    finally:
        subprocess.run([*PG, "stop", pgdir], check=False)


def test_outage_gives_503_and_service_resumes(own_server: tuple[str, str]) -> None:
    url, pgdir = own_server
    lm = loadmaster.open(url)
    lm.hosts.create("h", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}})
    lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    first, second = lm.vms.create("a", "f"), lm.vms.create("b", "f")
    lm.allocations.claim(first.uuid, "h")

    subprocess.run([*PG, "halt", pgdir], check=True)
    with pytest.raises(StoreUnavailable) as err:
        lm.allocations.claim(second.uuid, "h")
    assert status_of(err.value) == 503  # what the API answers for it
    with pytest.raises(StoreUnavailable):
        lm.hosts.list()

    subprocess.run([*PG, "resume", pgdir], check=True)
    assert [h.name for h in lm.hosts.list()] == ["h"]
    assert lm.vms.get(second.uuid).state == "requested"  # the failed claim wrote nothing
    lm.allocations.claim(second.uuid, "h")
    assert lm.allocations.usages(["h"])["h"]["VCPU"].pending == 2
    assert audit(lm.store) == []
    lm.close()


def test_a_restart_while_idle_costs_no_call(own_server: tuple[str, str]) -> None:
    """The server restarts while nothing is asked: the pooled connections are dead, and the
    first call after finds out by a ping (they sat idle past IDLE_PING_S), not by failing."""
    url, pgdir = own_server
    with loadmaster.open(url) as lm:
        lm.hosts.create("h", inventories={"VCPU": {"total": 8}})
        assert [h.name for h in lm.hosts.list()] == ["h"]
        subprocess.run([*PG, "halt", pgdir], check=True)
        subprocess.run([*PG, "resume", pgdir], check=True)
        time.sleep(IDLE_PING_S)
        assert [h.name for h in lm.hosts.list()] == ["h"]
        lm.hosts.create("h2", inventories={"VCPU": {"total": 8}})
