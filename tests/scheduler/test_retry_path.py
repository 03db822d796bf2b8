"""The scheduler's retry path (issue 13, defect 10): a reload after a lost claim race
forgets the static verdicts, a claim pinned to a generation is not retried by the ledger,
a raising plugin is named, and the vocabulary sync never gives up silently."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster.cluster import sync_standard_vocabulary
from loadmaster.errors import ConcurrentUpdate, PluginFailed, StoreUnavailable
from loadmaster.pending import Claim, Ledger
from loadmaster.scheduler import RequestSpec, Scheduler
from loadmaster.scheduler import registry as registry_module
from loadmaster.scheduler.core import plugins as plugins_module
from loadmaster.scheduler.core.plugins import load_filters
from loadmaster.service import Loadmaster
from loadmaster.store.schema import ResourceClassRow


@contextmanager
def _apart(calls: object) -> Iterator[None]:
    yield None


def _lose_first_claim(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch, meanwhile: Any
) -> list[int]:
    """The scheduler's first claim loses: just before it, another writer changes the
    chosen host (``meanwhile``, which must bump its generation). Returns the claim-call
    counter. The reads and the claim in two transactions, as on PostgreSQL and for a
    batch over a claim chunk: SQLite's one transaction per call lets no writer in between
    (``test_one_transaction.py`` has its races)."""
    monkeypatch.setattr(slm.scheduler, "_one_transaction", _apart)
    ledger = slm.scheduler._ledger
    real = ledger.claim_many
    calls = [0]

    def racing(claims: Sequence[Claim], **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            meanwhile(claims)
        return real(claims, **kwargs)

    monkeypatch.setattr(ledger, "claim_many", racing)
    return calls


def test_a_host_created_during_the_race_does_not_break_the_retry(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    vms = add_vms(slm, 3)

    def new_host(claims: Sequence[Claim]) -> None:
        add_hosts(slm, 1, prefix="late")
        # The chosen host leaves service too, so the claim really loses and the scheduler
        # reloads hosts that now include one it never saw.
        slm.hosts.set_state(claims[0].host, "maintenance")

    calls = _lose_first_claim(slm, monkeypatch, new_host)
    result = slm.scheduler.schedule([RequestSpec(vms=vms)])
    assert [p.error for p in result.placements] == [None, None, None]
    assert result.conflicts >= 1 and calls[0] >= 2


def test_a_host_gone_to_maintenance_is_not_chosen_again(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The big host wins every decision (spread), so a scheduler still trusting its old
    # verdicts would pick it again and again.
    add_hosts(slm, 1, prefix="big", vcpu=64, memory=131072)
    add_hosts(slm, 1, prefix="small")
    small_flavor(slm)
    vms = add_vms(slm, 1)
    gone: list[str] = []

    def maintenance(claims: Sequence[Claim]) -> None:
        gone.append(claims[0].host)
        slm.hosts.set_state(claims[0].host, "maintenance")

    calls = _lose_first_claim(slm, monkeypatch, maintenance)
    result = slm.scheduler.schedule([RequestSpec(vms=vms)])
    assert result.placements[0].error is None
    assert gone == ["big0"]
    assert result.placements[0].host == "small0"
    assert calls[0] == 2  # one conflict, then straight to the other host
    assert result.conflicts == 1


def test_a_host_deleted_during_the_race_is_left_for_another(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_hosts(slm, 1, prefix="big", vcpu=64, memory=131072)
    add_hosts(slm, 1, prefix="small")
    small_flavor(slm)
    vms = add_vms(slm, 1)
    calls = _lose_first_claim(slm, monkeypatch, lambda claims: slm.hosts.delete(claims[0].host))
    result = slm.scheduler.schedule([RequestSpec(vms=vms)])
    assert result.placements[0].error is None
    assert result.placements[0].host == "small0"
    assert calls[0] == 2


def test_a_pinned_claim_is_not_retried(slm: Loadmaster, monkeypatch: pytest.MonkeyPatch) -> None:
    add_hosts(slm, 1)
    small_flavor(slm)
    (vm,) = add_vms(slm, 1)
    ledger = Ledger(slm.store, conflict_retries=5)
    writes = [0]
    real_transaction = slm.store.transaction

    def counted() -> Any:
        writes[0] += 1
        return real_transaction()

    monkeypatch.setattr(slm.store, "transaction", counted)
    stale = slm.hosts.get("h0").generation
    slm.hosts.set_state("h0", "up")
    writes[0] = 0
    with pytest.raises(ConcurrentUpdate):
        ledger.claim(vm, "h0", expected_generation=stale)
    assert writes[0] == 1


def test_a_raising_plugin_is_named(slm: Loadmaster, monkeypatch: pytest.MonkeyPatch) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    vms = add_vms(slm, 2)
    filters = load_filters()
    victim = next(f for f in filters if f.mask is not None)

    class Broken:
        def mask(self, *_args: object) -> None:
            raise ZeroDivisionError("plugin bug")

    broken = [replace(f, mask=Broken()) if f is victim else f for f in filters]
    # Both the claiming scheduler and its read-only twin load the broken plugin.
    monkeypatch.setattr(plugins_module, "load_filters", lambda: broken)
    monkeypatch.setattr(registry_module, "load_filters", lambda: broken)
    scheduler = Scheduler(slm.store)
    result = scheduler.schedule([RequestSpec(vms=vms)])
    for placement in result.placements:
        assert isinstance(placement.error, PluginFailed)
        assert victim.name in placement.error.detail
    assert len(slm.vms.list(state="requested")) == 2  # nothing was claimed
    with pytest.raises(PluginFailed, match=victim.name):
        scheduler.capacity("small")


def test_vocabulary_sync_tolerates_a_racing_twin_and_never_gives_up_silently(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with slm.store.write() as session:
        session.query(ResourceClassRow).filter(ResourceClassRow.name == "VCPU").delete()
    sync_standard_vocabulary(slm.store)  # a twin process may have synced some names: fine
    sync_standard_vocabulary(slm.store)
    assert "VCPU" in {rc.name for rc in slm.resource_classes.list()}

    def refusing() -> Any:
        raise IntegrityError("INSERT ...", {}, Exception("duplicate key"))

    monkeypatch.setattr(slm.store, "write", refusing)
    with pytest.raises(IntegrityError):
        sync_standard_vocabulary(slm.store)


def test_missing_names_after_a_sync_are_an_error(
    slm: Loadmaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with slm.store.write() as session:
        session.query(ResourceClassRow).filter(ResourceClassRow.name == "VCPU").delete()
    real_write = slm.store.write

    class Nothing:
        def __enter__(self) -> Any:
            self.ctx = real_write()
            session = self.ctx.__enter__()
            session.execute = lambda *a, **k: None  # type: ignore[method-assign]
            return session

        def __exit__(self, *exc: object) -> None:
            self.ctx.__exit__(*exc)

    monkeypatch.setattr(slm.store, "write", Nothing)
    with pytest.raises(StoreUnavailable, match="VCPU"):
        sync_standard_vocabulary(slm.store)
