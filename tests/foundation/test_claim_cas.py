"""A claim's write: the host generations' compare-and-swap in the database, the clock
stamp that goes with it, and the VM's host_seq, on each backend (issue #11 made the
swap and the stamp one statement, and reads the host with its tree in one)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

import loadmaster
from loadmaster.errors import ConcurrentUpdate
from loadmaster.pending import Ledger
from loadmaster.pending import claims as claims_module
from loadmaster.service import Loadmaster
from loadmaster.store import locking
from loadmaster.store.driver import Rows
from loadmaster.store.schema import ClusterClockRow, HostRow, VmRow


@pytest.fixture
def cluster(lm: Loadmaster) -> Loadmaster:
    lm.hosts.create("h", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}})
    root = lm.hosts.create("n")
    for cell in ("n-0", "n-1"):
        lm.hosts.create(
            cell, parent=root.uuid, inventories={"VCPU": {"total": 4}, "MEMORY_MB": {"total": 4096}}
        )
    lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    return lm


def _state(lm: Loadmaster) -> tuple[int, dict[str, tuple[int, int]]]:
    """The clock, and each provider's (generation, changed_seq)."""
    with lm.store.read() as session:
        seq = session.scalar(select(ClusterClockRow.seq))
        hosts = {
            name: (generation, stamp)
            for name, generation, stamp in session.execute(
                select(HostRow.name, HostRow.generation, HostRow.changed_seq)
            )
        }
    assert seq is not None
    return seq, hosts


@pytest.mark.parametrize("host", ["h", "n"])
def test_a_claim_stamps_its_hosts_with_the_clock_it_returns(cluster: Loadmaster, host: str) -> None:
    lm = cluster
    _, before = _state(lm)
    vm = lm.vms.create("v", "f").uuid
    outcome = lm.allocations.claim_many([claims_module.Claim(vm, host)])[0]
    seq, after = _state(lm)
    assert outcome.ok and outcome.clock == seq
    # Every provider the records are on, and the root, moved one and carry the clock.
    touched = {host} | {r.host for r in outcome.allocations}
    for name, (generation, stamp) in after.items():
        if name in touched:
            assert (generation, stamp) == (before[name][0] + 1, seq), name
        else:
            assert after[name] == before[name], name
    with lm.store.read() as session:
        host_seq = session.scalar(select(VmRow.host_seq).where(VmRow.uuid == vm))
    assert host_seq == after[host][0]


@pytest.mark.parametrize("host", ["h", "n"])
def test_a_claim_that_read_a_stale_generation_loses_and_writes_nothing(
    cluster: Loadmaster, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What READ COMMITTED allows: another writer commits between the claim's read of the
    host and its compare-and-swap. The claim read generation g - 1 where g is now."""
    lm = cluster
    real = claims_module._hosts_by_ident

    def stale(session: Session, idents: set[str]) -> Any:
        found, providers = real(session, idents)
        old = {p.id: replace(p, generation=p.generation - 1) for p in providers}
        return {key: old[row.id] for key, row in found.items()}, list(old.values())

    monkeypatch.setattr(claims_module, "_hosts_by_ident", stale)
    vm = lm.vms.create("v", "f").uuid
    before = _state(lm)
    with pytest.raises(ConcurrentUpdate, match="another writer"):
        Ledger(lm.store, conflict_retries=1).claim(vm, host)
    assert _state(lm) == before
    assert lm.vms.get(vm).state == "requested"
    assert lm.allocations.allocations() == []


def test_hosts_carry_the_clock_value_taken_when_another_writer_moved_it_meanwhile(
    cluster: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap stamps the hosts with the clock's next value, read before the clock is
    advanced (last, by the lock order); on PostgreSQL another writer may advance it in
    between. The hosts must then carry the value the claim's advance took, or a
    scheduler that read the other writer's value would never reload them."""
    lm = cluster
    real = locking._advance_rows

    def after_another_writer(session: Session, *, layout: bool) -> Rows:
        real(session, layout=False).scalar_one()  # as if another transaction had one
        return real(session, layout=layout)

    monkeypatch.setattr(locking, "_advance_rows", after_another_writer)
    vm = lm.vms.create("v", "f").uuid
    seq_before, _ = _state(lm)
    outcome = lm.allocations.claim_many([claims_module.Claim(vm, "n")])[0]
    seq, after = _state(lm)
    assert outcome.clock == seq == seq_before + 2
    assert {name: stamp for name, (_, stamp) in after.items() if stamp == seq} == {
        "n": seq,
        **{r.host: seq for r in outcome.allocations},
    }


def test_the_compare_and_swap_of_several_hosts_searches_their_ids(tmp_path: Path) -> None:
    """SQLite scans the whole hosts table for a row-value IN of two or more pairs (12 ms a
    batch at 100,000 hosts); the swap names the ids too, so it searches the key."""
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'plan.db'}")
    try:
        params = {"pairs": [(1, 0), (2, 0), (3, 0)], "ids": [1, 2, 3]}
        with lm.store.read() as session:
            connection = session.connection()
            # The SQL and values the driver is handed (store/driver.py).
            form = locking._CAS_AND_STAMP.form(connection.dialect, params)
            assert form is not None
            plan = connection.exec_driver_sql(
                f"EXPLAIN QUERY PLAN {form.sql}", form.values(params)
            ).all()
        details = [row[-1] for row in plan]
        assert not any(d.startswith("SCAN hosts") for d in details), details
        assert any("hosts USING INTEGER PRIMARY KEY" in d for d in details), details
    finally:
        lm.close()
