"""Where the scheduler's snapshot comes from: the store, read once and then kept current.

A refresh reads the cluster clock (one row): unchanged, nothing else is read; moved, only
the providers stamped since are reloaded (every claim, release, inventory, trait, aggregate
or state change stamps them), and a new class, trait, aggregate or tree shape reloads all.
The scheduler's own claims that landed are applied here directly (``landed``), so its next
call does not read them back.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import (
    BindParameter,
    Float,
    Integer,
    String,
    bindparam,
    cast,
    func,
    literal_column,
    null,
    select,
    union_all,
)

from loadmaster.cluster import lookup
from loadmaster.cluster.liveness import DEFAULT_SILENT_AFTER_S, epoch
from loadmaster.cluster.records import GroupRecord
from loadmaster.cluster.vms import PLACED_STATES
from loadmaster.pending import trees
from loadmaster.resources import Inventory
from loadmaster.resources.tree_fit import Affinity
from loadmaster.scheduler.core.snapshot import STATE_CODE, ClassTraits, Snapshot
from loadmaster.store import Prepared, Store, locking, run
from loadmaster.store.chunks import in_chunks
from loadmaster.store.locking import execute_core
from loadmaster.store.schema import (
    HostAgentRow,
    HostAggregateRow,
    HostReportRow,
    HostRow,
    HostTraitRow,
    ServerGroupRow,
    TraitRow,
    VmRow,
)
from loadmaster.store.transaction import Transaction

# A claim of ours that landed: (host, amounts, group, one_node, affinity, class_traits,
# held on sharing providers), as ``Snapshot.apply`` takes it.
Landed = tuple[
    int,
    Mapping[str, int],
    str | None,
    bool,
    Affinity | None,
    ClassTraits,
    tuple[tuple[str, int], ...],
]


class SnapshotSource:
    """The one owner of a scheduler's ``Snapshot``: ``snapshot`` is read-only to all else."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.snapshot = Snapshot()
        self._reports_seen: datetime | None = None
        # time.monotonic() of the last read of the reports; None: read them next time
        self._reports_read: float | None = None
        self._agents_seen: datetime | None = None
        # time.monotonic() of the last read of the agents; None: read them all next time
        self._agents_read: float | None = None
        self.agent_silent_after = DEFAULT_SILENT_AFTER_S
        # The cluster clock (seq, layout_seq) the snapshot reflects; None: nothing loaded.
        self._clock: tuple[int, int] | None = None
        # Provider id -> the clock value our own last claim there stamped.
        self._own_stamps: dict[int, int] = {}
        self._thawed = False

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Around changes to the snapshot: each writer thaws its arrays first (``_thaw``),
        so that a refresh which finds nothing to change, most of them, leaves the
        arrays' flags alone (setting them costs a placement time); whatever
        was thawed is frozen again at the end."""
        try:
            yield
        finally:
            if self._thawed:
                self._thawed = False
                self.snapshot.freeze()  # a full load replaces it: freeze whichever is current

    def _thaw(self) -> Snapshot:
        if not self._thawed:
            self.snapshot.freeze(False)
            self._thawed = True
        return self.snapshot

    # -- refreshing --------------------------------------------------------------------
    def refresh(self, session: Transaction | None = None) -> Snapshot:
        """Bring the snapshot up to date with the store, reloading only what changed: the
        cluster clock says whether anything did (one row read), and which providers.
        ``session``: a read transaction the caller has open, else one of its own."""
        with self._store.read_transaction(session) as session, self._writing():
            # Read first (or with the providers stamped since, in one statement): a change
            # committed after it is stamped later and seen next time.
            stamped: list[tuple[int, int, int]] = []
            if self._clock is None:
                seen = locking.clock(session)
            else:
                seen, stamped = locking.clock_and_changed(session, self._clock[0])
            if self._clock is None or seen[1] != self._clock[1]:
                self._load_all(session)
            elif seen[0] != self._clock[0]:
                snap = self.snapshot
                # A provider whose last stamp is our own claim's, at the generation
                # that claim left, holds nothing we have not applied (a write that added
                # usage meanwhile moved its generation too). Some changes move no
                # generation (a Placement client's deletion), hence the stamp.
                changed = [
                    host_id
                    for host_id, stamp, generation in stamped
                    if self._own_stamps.get(host_id) != stamp
                    or host_id not in snap.row_of
                    or snap.generation[snap.row_of[host_id]] != generation
                ]
                if changed and not self._reload(session, changed):
                    self._load_all(session)
            self._clock = seen
            self._own_stamps.clear()
            self._load_reports(session)
            self._load_agents(session)
        return self.snapshot

    def _load_all(self, session: Transaction) -> None:
        snap = self.snapshot = Snapshot()
        rows = execute_core(
            session,
            select(
                HostRow.id, HostRow.uuid, HostRow.name, HostRow.root_id, HostRow.parent_id
            ).order_by(HostRow.id),
        ).all()
        snap.provider_ids = np.array([r.id for r in rows], np.int64)
        snap.provider_names = [r.name for r in rows]
        snap.row_of = {r.id: i for i, r in enumerate(rows)}
        roots = [i for i, r in enumerate(rows) if r.root_id in (None, r.id)]
        snap.roots = np.array(roots, np.int64)
        host_of_root = {int(row): h for h, row in enumerate(roots)}
        snap.root_of = np.array(
            [host_of_root[snap.row_of[r.root_id or r.id]] for r in rows], np.int64
        )
        snap.parent_row = np.array(
            [-1 if r.parent_id is None else snap.row_of[r.parent_id] for r in rows], np.int64
        )
        snap.tree = [[] for _ in roots]
        for row, host in enumerate(snap.root_of):
            snap.tree[int(host)].append(row)  # ids ascend, so the root comes first
        snap.flat = len(roots) == len(rows)
        snap.names = [rows[r].name for r in roots]
        snap.uuids = [rows[r].uuid for r in roots]
        snap.index = {name: h for h, name in enumerate(snap.names)}
        snap.index.update({uuid: h for h, uuid in enumerate(snap.uuids)})
        snap.classes = {name: c for c, name in enumerate(sorted(lookup.class_ids(session)))}
        snap.traits = {
            name: t
            for t, name in enumerate(
                sorted(
                    execute_core(
                        session, select(TraitRow.name).join(HostTraitRow).distinct()
                    ).scalars()
                )
            )
        }
        snap.aggregates = {
            name: a
            for a, name in enumerate(
                sorted(
                    execute_core(session, select(HostAggregateRow.aggregate).distinct()).scalars()
                )
            )
        }
        p, c = len(rows), len(snap.classes)
        snap.generation = np.zeros(p, np.int64)
        snap.status = np.zeros(p, np.int64)
        snap.capacity = np.zeros((c, p), np.int64)
        snap.used = np.zeros((c, p), np.int64)
        snap.min_unit = np.zeros((c, p), np.int64)
        snap.max_unit = np.zeros((c, p), np.int64)
        snap.step = np.ones((c, p), np.int64)
        snap.trait_matrix = np.zeros((p, len(snap.traits)), np.bool_)
        snap.aggregate_matrix = np.zeros((p, len(snap.aggregates)), np.bool_)
        snap.vm_count = np.zeros(len(roots), np.int64)
        snap.load = np.full(len(roots), np.nan)
        snap.agent_seen = np.full(len(roots), np.nan)
        snap.agent_listed = np.ones(len(roots), np.bool_)
        self._reports_seen = None
        self._agents_seen = None
        self._agents_read = None
        self._reports_read = None
        loaded = self._reload(session, list(snap.row_of))
        assert loaded, "a full load knows every class, trait and aggregate"

    def _reload(self, session: Transaction, host_ids: Sequence[int]) -> bool:
        """Reload these providers; False when they use a class, trait or aggregate (or a
        tree shape) the arrays have no room for, so the caller must load everything. One
        statement per chunk reads their rows, inventories, usage, traits and aggregates
        (on PostgreSQL each statement is a round trip, and with several workers every
        refresh reloads what the others changed)."""
        snap = self._thaw()
        for chunk in in_chunks(list(host_ids)):
            chunk_rows = [snap.row_of[i] for i in chunk]
            for array in (snap.capacity, snap.used, snap.min_unit, snap.max_unit):
                array[:, chunk_rows] = 0
            snap.step[:, chunk_rows] = 1
            snap.trait_matrix[chunk_rows] = False
            snap.aggregate_matrix[chunk_rows] = False
            # The VMs are counted on the trees' roots, whichever of their providers changed.
            hosts = sorted({int(snap.root_of[r]) for r in chunk_rows})
            snap.vm_count[hosts] = 0
            roots = [int(snap.provider_ids[snap.roots[h]]) for h in hosts]
            found = run(session, _PROVIDER_CONTENTS, {"ids": chunk, "roots": roots}).all()
            # A usage row names its class by id; the inventory rows say whose id it is.
            class_name = {r.class_id: r.name for r in found if r.kind == trees.INVENTORY}
            for kind, host_id, class_id, name, a, b, c, d, e, ratio in found:
                row = snap.row_of[host_id]
                if kind == _VMS:  # a: how many placed VMs run on or head to it
                    snap.vm_count[snap.root_of[row]] += a
                elif kind == _HOST:  # name: its state; a: its generation; b: its root
                    if snap.provider_ids[snap.roots[snap.root_of[row]]] != (b or host_id):
                        return False
                    snap.generation[row] = a
                    snap.status[row] = STATE_CODE[name]
                elif kind == trees.INVENTORY:
                    column = snap.classes.get(name)
                    if column is None:
                        return False
                    snap.capacity[column, row] = Inventory(a, b, c, d, e, ratio).capacity
                    snap.min_unit[column, row] = c
                    snap.max_unit[column, row] = d
                    snap.step[column, row] = e
                elif kind == trees.USED:
                    column = snap.classes.get(class_name.get(class_id, ""))
                    if column is None:
                        return False
                    snap.used[column, row] += int(a)  # active and pending, a row each
                elif kind == trees.TRAIT:
                    if name not in snap.traits:
                        return False
                    snap.trait_matrix[row, snap.traits[name]] = True
                else:
                    if name not in snap.aggregates:
                        return False
                    snap.aggregate_matrix[row, snap.aggregates[name]] = True
        snap.derive()
        return True

    def agents_changed(self) -> None:
        """An agent's row was written through this process: the next refresh reads it."""
        self._agents_read = None

    def reported(self) -> None:
        """A report was recorded through this scheduler: the next refresh reads it."""
        self._reports_read = None

    def _load_reports(self, session: Transaction) -> None:
        """The hosts' measured load, for the load weigher: read at most once a second
        (agents report every several seconds, and a read per call was a round trip per
        placement on PostgreSQL), and at the next refresh after a report this process
        recorded itself."""
        snap = self.snapshot
        if (
            self._reports_read is not None
            and time.monotonic() - self._reports_read < _REPORTS_EVERY_S
        ):
            return
        self._reports_read = time.monotonic()
        if self._reports_seen is None:
            reports = execute_core(session, _REPORTS)
        else:
            since = self._reports_seen - _STAMP_MARGIN
            reports = execute_core(session, _REPORTS_SINCE, {"since": since})
        for host_id, reported_at, load in reports:
            row = snap.row_of.get(host_id)
            if row is None:
                continue
            snap = self._thaw()
            values = [float(v) for v in load.values()] if load else []
            snap.load[snap.root_of[row]] = max(values) if values else np.nan
            if self._reports_seen is None or reported_at > self._reports_seen:
                self._reports_seen = reported_at

    def _load_agents(self, session: Transaction) -> None:
        """When each host's agent was last heard from: every agent at a full load, then
        those heard from since the last read (less a margin, since the processes that
        write the stamps commit them a little after taking them), at most once a second:
        in a live fleet every agent was heard from within the margin, and liveness is
        judged in tens of seconds."""
        snap = self.snapshot
        snap.taken_at = time.time()
        snap.agent_silent_after = self.agent_silent_after
        if self._agents_read is not None and time.monotonic() - self._agents_read < _AGENTS_EVERY_S:
            return  # a cloud without agents at all is not read again each call either
        query = select(
            HostAgentRow.host_id,
            HostAgentRow.last_seen_at,
            HostAgentRow.agent_run,
            HostAgentRow.listed_run,
        )
        if self._agents_seen is not None:
            query = query.where(HostAgentRow.last_seen_at > self._agents_seen - _STAMP_MARGIN)
        self._agents_read = time.monotonic()
        for host_id, last_seen, agent_run, listed_run in execute_core(session, query):
            row = snap.row_of.get(host_id)
            if row is None:
                continue
            snap = self._thaw()
            snap.agent_seen[snap.root_of[row]] = epoch(last_seen)
            # A manager that never said its run is judged by its silence alone.
            snap.agent_listed[snap.root_of[row]] = agent_run is None or listed_run == agent_run
            snap.agents_in_use = True
            if self._agents_seen is None or last_seen > self._agents_seen:
                self._agents_seen = last_seen

    def load_groups(
        self,
        groups: Collection[GroupRecord],
        leaving: Mapping[str, Sequence[int]],
        session: Transaction | None = None,
    ) -> None:
        """Count each group's placed members per host, pending ones included, less the
        hard-affinity members of the call that are ``leaving`` a host (the group follows
        them, so they must not pin it to where they are leaving). ``session``: a read
        transaction the caller has open, else one of its own."""
        with self._writing():
            snap = self._thaw() if groups else self.snapshot
            snap.group_members = {g.name: np.zeros(snap.size, np.int64) for g in groups}
            if groups:
                with self._store.read_transaction(session) as session:
                    rows = execute_core(
                        session,
                        select(ServerGroupRow.name, VmRow.host_id, VmRow.target_host_id)
                        .join(VmRow, VmRow.group_id == ServerGroupRow.id)
                        .where(
                            ServerGroupRow.name.in_({g.name for g in groups}),
                            VmRow.state.in_(PLACED_STATES),
                        ),
                    ).all()
                for name, host_id, target_id in rows:
                    for provider in (host_id, target_id):
                        if provider is not None and provider in snap.row_of:
                            snap.group_members[name][snap.root_of[snap.row_of[provider]]] += 1
            for name, hosts in leaving.items():
                counts = snap.group_members[name]
                np.subtract.at(counts, list(hosts), 1)
                np.maximum(counts, 0, out=counts)

    # -- our own claims ----------------------------------------------------------------
    def landed(
        self,
        claims: Sequence[Landed],
        clock: int | None,
    ) -> None:
        """Our claims landed, as ``(host, amounts, group, one_node, affinity, class_traits,
        held)``:
        apply them as the
        ledger wrote them. The ledger bumped each tree's generations once and stamped
        them with ``clock``, a change the snapshot then holds (None: do not trust that,
        read those providers again at the next refresh)."""
        with self._writing():
            snap = self._thaw()
            for host, amounts, group, one_node, affinity, class_traits, held in claims:
                snap.apply(
                    host,
                    amounts,
                    group,
                    one_node=one_node,
                    affinity=affinity,
                    class_traits=class_traits,
                    held=held,
                )
            for host in {claim[0] for claim in claims}:
                snap.generation[snap.tree[host]] += 1
                if clock is not None:
                    for row in snap.tree[host]:
                        self._own_stamps[int(snap.provider_ids[row])] = clock


_STAMP_MARGIN = timedelta(seconds=10)
_AGENTS_EVERY_S = 1.0
_REPORTS_EVERY_S = 1.0
_REPORTS = select(HostReportRow.host_id, HostReportRow.reported_at, HostReportRow.load)
# Read again with the margin, as the agents' stamps are: a server stamps the reports it
# flushes a little before it commits them.
_REPORTS_SINCE = _REPORTS.where(HostReportRow.reported_at > bindparam("since"))


# ``_reload``'s one statement: the providers' own rows and their aggregates beside what
# the ledger's trees read (inventories with class names, usage, traits).
_HOST, _AGGREGATE, _VMS = 10, 11, 12
_ROOTS: BindParameter[Any] = bindparam("roots", expanding=True)
_PLACED = VmRow.state.in_(PLACED_STATES)
_PROVIDER_CONTENTS = Prepared(
    union_all(
        # The first branch names the columns of them all.
        select(
            literal_column(str(_HOST)).label("kind"),
            HostRow.id.label("host_id"),
            cast(null(), Integer).label("class_id"),
            HostRow.state.label("name"),
            HostRow.generation.label("a"),
            HostRow.root_id.label("b"),
            trees.NO_INT.label("c"),
            trees.NO_INT.label("d"),
            trees.NO_INT.label("e"),
            cast(null(), Float).label("ratio"),
        ).where(HostRow.id.in_(trees.IDS)),
        *trees.TREE_BRANCHES,
        select(
            *trees.sparse_row(_AGGREGATE, HostAggregateRow.host_id, HostAggregateRow.aggregate)
        ).where(HostAggregateRow.host_id.in_(trees.IDS)),
        # A migrating VM counts on its source and its destination: a row from each branch.
        *(
            select(*trees.sparse_row(_VMS, column, cast(null(), String), a=func.count()))
            .where(_PLACED, column.in_(_ROOTS))
            .group_by(column)
            for column in (VmRow.host_id, VmRow.target_host_id)
        ),
    )
)
