"""What the hot path needs of a transaction, so that it runs in an ORM ``Session`` or on a
bare Core connection alike.

A claim is Core statements on the driver's cursor (``store/driver.py``), but it was run in
a ``Session``: Placement's consumer writes call it inside their own ORM transaction, and
the VMs' events were written by the session's commit hook. The session's begin and
commit cost about twice a Core connection's, a good share of a placement in-process
(docs/architecture.md has the figures). ``Store.transaction`` gives the scheduler's claims
a ``CoreTransaction``, and
``Store.read_transaction`` its reads (the snapshot's refresh, the resolve); a ``Session``
still serves every other reader and writer, and both satisfy ``Transaction``.
"""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session


class Transaction(Protocol):
    """The part of a ``Session`` the Core-only code uses: its connection (in the
    transaction), ``info`` for what the transaction collects until commit (the hosts it
    stamped, the VMs it changed), and ``flush`` before a statement, as an ORM statement
    would autoflush."""

    @property
    def info(self) -> dict[Any, Any]: ...

    def connection(self) -> Connection: ...

    def flush(self) -> None: ...


class CoreTransaction:
    """A transaction on a Core connection, begun by ``Store.transaction`` or
    ``Store.read_transaction``: no ORM objects, so nothing to flush."""

    __slots__ = ("_connection", "info")

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.info: dict[Any, Any] = {}

    def connection(self) -> Connection:
        return self._connection

    def flush(self) -> None:
        pass

    def close(self) -> None:
        """The ORM session ``as_session`` made on it closed (its connection and
        transaction are the caller's, ended by the caller)."""
        session = self.info.pop(_SESSION, None)
        if session is not None:
            session.close()


def as_session(transaction: Transaction) -> Session:
    """The transaction as an ORM session, for the lookups that read entities (a named
    flavor or server group): itself if it is one, else a session made at first use on the
    Core transaction's connection, which joins its transaction without ending it."""
    if isinstance(transaction, Session):
        return transaction
    session = transaction.info.get(_SESSION)
    if session is None:
        session = transaction.info[_SESSION] = Session(
            bind=transaction.connection(), join_transaction_mode="rollback_only"
        )
    return session


_SESSION = "loadmaster_orm_session"
