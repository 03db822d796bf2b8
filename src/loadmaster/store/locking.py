"""Row locks, host generations and the clock: the one module that owns the lock order.

Every write transaction that locks rows of more than one kind takes them in this order,
each kind in ascending id order, so two PostgreSQL transactions touching the same rows
queue up instead of deadlocking (SQLite serialises writers anyway):

1. VMs, ``FOR UPDATE`` (``lock_vms``; ``lookup.vm_row(lock=True)`` for one);
2. their server groups: ``FOR KEY SHARE`` right after the VMs (``share_groups``), or
   ``FOR UPDATE`` by a claim that checks the groups' rules (``lock_groups``);
3. hosts, ``FOR NO KEY UPDATE``, when their generations move (``bump_generations``,
   ``touch_generations``): a claim decides from what it read of the hosts, and the
   compare-and-swap on the generation proves nobody changed them meanwhile;
4. consumers (``bump_consumers``), whose generations move with their records: a VM's
   consumer only after the VM's row, so writers of one VM queue on the VM;
5. the cluster clock's one row (``mark_changed``), last of all: it is held until commit,
   so writers take clock values in the order they commit, and a scheduler that has read
   value N has seen every change stamped N or less.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    BindParameter,
    Executable,
    Result,
    bindparam,
    cast,
    func,
    literal_column,
    null,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.orm import Session

from loadmaster.errors import ConcurrentUpdate
from loadmaster.store.chunks import in_chunks
from loadmaster.store.driver import Prepared, Rows, run, run_chunked
from loadmaster.store.schema import (
    ClusterClockRow,
    HostRow,
    ServerGroupRow,
    VmRow,
)
from loadmaster.store.transaction import Transaction

# Where a write transaction collects the hosts it stamped on the cluster clock
# (``mark_changed``), for the listeners told once it commits.
CHANGED_HOSTS = "loadmaster_changed_hosts"
# PostgreSQL's channel a transaction that stamped hosts notifies (delivered on commit,
# discarded on rollback), so that other processes' watchers look at the clock at once
# instead of at their next tick.
CLOCK_CHANNEL = "loadmaster_clock"
CLOCK_ROW = 1


def now() -> datetime:
    """The server's clock, as naive UTC (what every timestamp column holds)."""
    return datetime.now(UTC).replace(tzinfo=None)


def iso_utc(stamp: datetime) -> str:
    """A time as ISO 8601 with its offset, in UTC, as the API and CLI show every time:
    a reader must not have to guess the zone. A naive time is a stored one, UTC."""
    aware = stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)
    return aware.isoformat()


def lock_vms(session: Session, uuids: Iterable[str]) -> dict[str, VmRow]:
    """The VMs by (canonical) uuid, locked in id order; their groups key-shared after."""
    found: dict[str, VmRow] = {}
    for chunk in in_chunks(sorted(set(uuids))):
        query = select(VmRow).where(VmRow.uuid.in_(chunk)).order_by(VmRow.id).with_for_update()
        for row in session.scalars(query):
            found[row.uuid] = row
    return found


def share_groups(session: Session, vms: Iterable[VmRow]) -> None:
    """Take the key-share lock on the VMs' server groups now, right after the VM rows.

    Updating a VM row twice in one transaction makes PostgreSQL re-check its foreign keys,
    which takes FOR KEY SHARE on the group row; taken that late (after host rows) it
    waited for a claim holding the group FOR UPDATE while that claim waited for our host
    row: a deadlock. Taken here it simply queues behind the claim."""
    ids = sorted({v.group_id for v in vms if v.group_id is not None})
    if ids:
        session.execute(
            select(ServerGroupRow.id)
            .where(ServerGroupRow.id.in_(ids))
            .order_by(ServerGroupRow.id)
            .with_for_update(read=True, key_share=True)
        )


def lock_groups(session: Transaction, group_ids: Collection[int]) -> list[Any]:
    """The groups' ``GROUP_COLUMNS``, locked for update in id order (a claim checks and
    changes their rules)."""
    return run_chunked(session, _LOCK_GROUPS, "ids", sorted(group_ids))


def bump_generations(
    session: Transaction,
    expected: Mapping[int, int],
    *,
    touch: Iterable[int] = (),
    clock: bool = True,
    before_clock: Callable[[], None] | None = None,
    sent: Callable[[], None] | None = None,
) -> int:
    """Compare-and-swap: each host's generation must still be what was read, else nothing lands.

    The rows are locked in id order first, then one UPDATE per chunk bumps them all. The
    lock is FOR NO KEY UPDATE (``key_share``): a plain FOR UPDATE would conflict with the
    key-share locks our own allocation inserts hold through their foreign key, and
    deadlock. ``touch``: more hosts to bump without the compare-and-swap (as
    ``touch_generations``), locked in the same id order as the others (two separate passes
    could deadlock). ``clock=False``: the caller has more rows to lock and advances the
    clock itself, last (``mark_changed``); returns 0 then. ``before_clock``: the caller's
    writes that lock rows after the hosts and before the clock (consumers). ``sent``:
    called once every statement is sent and before any answer is read: a pipeline's end
    (``driver.pipelined``), so that the caller's writes, the swaps, the consumers and the
    clock's advance are one round trip on PostgreSQL.

    A chunk of one row is not locked apart: its UPDATE takes the same FOR NO KEY UPDATE
    lock on that one row, and there is no order to keep among one. Without
    ``touch``, the UPDATE also stamps the hosts with the clock value the clock is about to
    take (``mark_changed``, still advanced last); should another writer have moved the
    clock in between (PostgreSQL), they are stamped again with the value it took. A swap
    that did not land is found after the clock's advance: the caller's rollback undoes it.
    """
    extra = set(touch) - set(expected)
    if extra:
        for chunk in in_chunks(sorted(extra | set(expected))):
            _lock_hosts(session, chunk)
    ids = sorted(expected)
    stamp = clock and not extra
    swaps = []
    for chunk in in_chunks(ids):
        if not extra and len(chunk) > 1:  # with ``touch``, every row is locked already
            _lock_hosts(session, chunk)
        pairs = {"pairs": [(i, expected[i]) for i in chunk], "ids": chunk}
        swaps.append((len(chunk), run(session, _CAS_AND_STAMP if stamp else _CAS, pairs)))
        if stamp:
            _changed(session, chunk)
    if before_clock is not None:
        before_clock()
    if extra:
        touch_generations(session, extra)
    seq, advanced = 0, None
    if clock and stamp:
        advanced = _advance_rows(session, layout=False)
    elif clock:
        seq = mark_changed(session, ids)
    if sent is not None:
        sent()
    if advanced is not None:
        seq = int(advanced.scalar_one())
    guessed: set[int] = set()
    for wanted, swap in swaps:
        landed = swap.rowcount
        if stamp:
            guessed.update(swap.scalars())
        if landed != wanted:
            raise ConcurrentUpdate(
                "a host was changed by another writer; retry", field="generation"
            )
    if guessed - {seq}:
        _stamp(session, ids, seq)
    return seq


def touch_generations(session: Transaction, host_ids: Iterable[int]) -> int:
    """Bump the hosts' generations without a compare-and-swap, for changes that never add
    usage (activation, release): they decide nothing from what they read of the host, but
    schedulers holding the old generation must still see the host changed. Rows are locked
    in id order, as ``bump_generations`` does."""
    ids = sorted(set(host_ids))
    for chunk in in_chunks(ids):
        _lock_hosts(session, chunk)
        run(session, _TOUCH, {"ids": chunk})
    return mark_changed(session, ids)


def mark_changed(session: Transaction, host_ids: Iterable[int], *, layout: bool = False) -> int:
    """Advance the cluster clock and stamp the hosts with it: schedulers reload them.
    ``layout``: providers were added, removed or moved between trees (a full reload).
    Placement's generations are the clients' compare-and-swap tokens and move only where
    Placement moves them; this is what tells a scheduler's snapshot what to re-read.
    Returns the clock value the hosts now carry."""
    seq = _advance(session, layout=layout)
    _stamp(session, sorted(set(host_ids)), seq)
    return seq


def _advance(session: Transaction, *, layout: bool) -> int:
    """The clock moved one on (and its layout too): the value it now holds. The row stays
    locked until commit; taken last of all, see the module's lock order.

    On PostgreSQL the same statement notifies the other processes' watchers, delivered
    when the transaction commits (they read which hosts from the clock; the notices of
    one transaction are one): every write that stamps hosts advances the clock, and a
    NOTIFY of its own was one more round trip per write."""
    return int(_advance_rows(session, layout=layout).scalar_one())


def _advance_rows(session: Transaction, *, layout: bool) -> Rows:
    """``_advance``'s statement sent; its answer read when wanted."""
    postgres = session.connection().dialect.name == "postgresql"
    statement = {
        (False, False): _ADVANCE,
        (True, False): _ADVANCE_LAYOUT,
        (False, True): _ADVANCE_AND_NOTIFY,
        (True, True): _ADVANCE_LAYOUT_AND_NOTIFY,
    }[layout, postgres]
    return run(session, statement)


def _stamp(session: Transaction, host_ids: list[int], seq: int) -> None:
    for chunk in in_chunks(host_ids):
        run(session, _STAMP, {"ids": chunk, "seq": seq})
    _changed(session, host_ids)


def _changed(session: Transaction, host_ids: Iterable[int]) -> None:
    """Noted for ``Store.listen``'s listeners, told once the transaction commits (other
    processes hear of it from the clock's advance, ``_advance``)."""
    session.info.setdefault(CHANGED_HOSTS, set()).update(host_ids)


def clock(session: Transaction) -> tuple[int, int]:
    """``(seq, layout_seq)`` as committed now."""
    seq, layout = execute_core(
        session,
        select(ClusterClockRow.seq, ClusterClockRow.layout_seq).where(
            ClusterClockRow.id == CLOCK_ROW
        ),
    ).one()
    return int(seq), int(layout)


def clock_and_changed(
    session: Transaction, since: int
) -> tuple[tuple[int, int], list[tuple[int, int, int]]]:
    """``clock()``, and the providers stamped after ``since`` as ``(id, changed_seq,
    generation)``: one statement, so both are of one moment."""
    seen: tuple[int, int] | None = None
    changed = []
    for kind, a, b, c in run(session, _CLOCK_AND_CHANGED, {"since": since}):
        if kind == 0:
            seen = (int(a), int(b))
        else:
            changed.append((int(a), int(b), int(c)))
    assert seen is not None, "the cluster clock has its one row"
    return seen, changed


_CLOCK_AND_CHANGED = Prepared(
    union_all(
        select(
            literal_column("0").label("kind"),
            ClusterClockRow.seq.label("a"),
            ClusterClockRow.layout_seq.label("b"),
            cast(null(), BigInteger).label("c"),
        ).where(ClusterClockRow.id == CLOCK_ROW),
        select(literal_column("1"), HostRow.id, HostRow.changed_seq, HostRow.generation).where(
            HostRow.changed_seq > bindparam("since")
        ),
    )
)


def generation_of(session: Session, host_id: int | None) -> int:
    return int(session.scalar(select(HostRow.generation).where(HostRow.id == host_id)) or 0)


def lock_hosts(session: Transaction, ids: Iterable[int]) -> None:
    """Lock hosts ``FOR NO KEY UPDATE`` in id order, all in one pass: for a write that
    learns the hosts it will touch in pieces (several consumers, a reshape's inventories
    and allocations), so that its later locks on them are held already and two such
    writes over crossing hosts queue up instead of deadlocking."""
    for chunk in in_chunks(sorted(set(ids))):
        _lock_hosts(session, chunk)


def _lock_hosts(session: Transaction, ids: list[int]) -> None:
    if session.connection().dialect.name == "sqlite":
        # No row locks (writers take turns): the SELECT would only read the rows again.
        session.flush()  # what it did besides, as every statement of an ORM session does
        return
    run(session, _LOCK_HOSTS, {"ids": ids})


def bump_consumers(session: Transaction, consumer_ids: Iterable[int]) -> None:
    """A consumer's records changed (claim, activation, release, a Placement write): its
    generation moves, so a Placement client holding the old one is refused, never lets
    its write undo a change it has not seen."""
    for chunk in in_chunks(sorted(set(consumer_ids))):
        run(session, _BUMP_CONSUMERS, {"ids": chunk})


def execute_core(
    session: Transaction, statement: Executable, params: Any = None
) -> Result[*tuple[Any, ...]]:
    """A Core statement in the session's transaction, after the ORM's autoflush as an ORM
    statement would have it, but on the session's connection: the session's own
    ``execute`` costs several times the statement on SQLite (measured: 11,000 of them took
    3.7 s of a 9.5 s profile of 1,000 placements). ``params``: a mapping, or a list of
    them (executemany)."""
    session.flush()
    return session.connection().execute(statement, params)


# The hot statements, built once and run on the driver's cursor (``store/driver.py``).
# Written on the tables, not the mapped classes: they need nothing of the ORM.
_HOSTS = HostRow.metadata.tables["hosts"]
_CLOCK = HostRow.metadata.tables["cluster_clock"]
_CONSUMERS = HostRow.metadata.tables["consumers"]
_IDS: BindParameter[Any] = bindparam("ids", expanding=True)
_LOCK_HOSTS = Prepared(
    select(HostRow.id)
    .where(HostRow.id.in_(_IDS))
    .order_by(HostRow.id)
    .with_for_update(key_share=True)
)
_CAS_UPDATE = (
    update(_HOSTS)
    # The ids alone as well: SQLite searches the primary key for a row-value IN of one
    # pair but scans the whole table for two or more (a cost every coalesced batch over
    # HTTP paid, growing with the hosts); with ``id IN`` it searches again.
    .where(_HOSTS.c.id.in_(_IDS))
    .where(tuple_(_HOSTS.c.id, _HOSTS.c.generation).in_(bindparam("pairs", expanding=True)))
    .values(generation=_HOSTS.c.generation + 1)
)
_CAS = Prepared(_CAS_UPDATE)
# The clock value the next ``_advance`` takes, unless another writer advances it first.
_NEXT_SEQ = select(_CLOCK.c.seq + 1).where(_CLOCK.c.id == CLOCK_ROW).scalar_subquery()
_CAS_AND_STAMP = Prepared(_CAS_UPDATE.values(changed_seq=_NEXT_SEQ).returning(_HOSTS.c.changed_seq))
_TOUCH = Prepared(
    update(_HOSTS).where(_HOSTS.c.id.in_(_IDS)).values(generation=_HOSTS.c.generation + 1)
)
_STAMP = Prepared(update(_HOSTS).where(_HOSTS.c.id.in_(_IDS)).values(changed_seq=bindparam("seq")))
_ADVANCE_UPDATE = (
    update(_CLOCK)
    .where(_CLOCK.c.id == CLOCK_ROW)
    .values(seq=_CLOCK.c.seq + 1)
    .returning(_CLOCK.c.seq)
)
_ADVANCE_LAYOUT_UPDATE = _ADVANCE_UPDATE.values(layout_seq=_CLOCK.c.layout_seq + 1)
_NOTIFIED = func.pg_notify(CLOCK_CHANNEL, "")
_ADVANCE = Prepared(_ADVANCE_UPDATE)
_ADVANCE_LAYOUT = Prepared(_ADVANCE_LAYOUT_UPDATE)
_ADVANCE_AND_NOTIFY = Prepared(_ADVANCE_UPDATE.returning(_NOTIFIED))
_ADVANCE_LAYOUT_AND_NOTIFY = Prepared(_ADVANCE_LAYOUT_UPDATE.returning(_NOTIFIED))
_BUMP_CONSUMERS = Prepared(
    update(_CONSUMERS)
    .where(_CONSUMERS.c.id.in_(_IDS))
    .values(generation=_CONSUMERS.c.generation + 1)
)
# What a claim and a scheduler's resolve read of a server group, as columns.
GROUP_COLUMNS = (
    ServerGroupRow.id,
    ServerGroupRow.uuid,
    ServerGroupRow.name,
    ServerGroupRow.policy,
    ServerGroupRow.max_per_host,
)
_LOCK_GROUPS = Prepared(
    select(*GROUP_COLUMNS)
    .where(ServerGroupRow.id.in_(_IDS))
    .order_by(ServerGroupRow.id)
    .with_for_update()
)
