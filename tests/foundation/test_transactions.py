"""The Core transactions of the hot path (``store/transaction.py``): a read on a bare
connection that lends an ORM session only to the lookups that need one."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from loadmaster.cluster import lookup
from loadmaster.errors import NotFound
from loadmaster.service import Loadmaster
from loadmaster.store.schema import FlavorRow
from loadmaster.store.transaction import CoreTransaction, as_session


def test_a_core_read_lends_one_orm_session_on_its_connection_and_closes_it(
    lm: Loadmaster,
) -> None:
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1}})
    with lm.store.read_transaction() as transaction:
        assert isinstance(transaction, CoreTransaction)
        session = as_session(transaction)
        assert as_session(transaction) is session
        assert session.connection() is transaction.connection()
        assert lookup.flavor_row(session, "small").name == "small"
        with pytest.raises(NotFound, match="flavor 'big': no such flavor"):
            lookup.flavor_row(session, "big")
    # Closed with the read: nothing it loaded is held.
    assert not session.identity_map
    with lm.store.read() as orm:
        assert as_session(orm) is orm
        assert orm.scalar(select(FlavorRow.name)) == "small"


def test_a_core_read_given_a_transaction_is_that_transaction(lm: Loadmaster) -> None:
    with lm.store.read_transaction() as outer, lm.store.read_transaction(outer) as inner:
        assert inner is outer
