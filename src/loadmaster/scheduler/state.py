"""The scheduler's in-memory picture of every host: numpy arrays, refreshed from the store.

Rows are providers (root hosts and their children), columns resource classes, so checking
10,000 hosts is a handful of vector operations. The store stays the source of truth: a
refresh reads only ``(id, generation)`` of every provider and reloads the ones whose
generation moved (every claim, release, inventory, trait, aggregate or state change bumps
it). Claims the scheduler decides but has not written yet are applied here too, which is
how each decision of a batch sees the ones before it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select, union_all
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.groups import GroupRecord
from loadmaster.cluster.records import HOST_STATES
from loadmaster.cluster.vms import PLACED_STATES
from loadmaster.resources.tree_fit import fit_in_tree
from loadmaster.store import Store, locking
from loadmaster.store.chunks import in_chunks
from loadmaster.store.schema import (
    HostAggregateRow,
    HostReportRow,
    HostRow,
    HostTraitRow,
    InventoryRow,
    ServerGroupRow,
    TraitRow,
    VmRow,
)

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Floats = npt.NDArray[np.float64]

STATE_CODE = {name: code for code, name in enumerate(HOST_STATES)}


@dataclass
class Checkpoint:
    used: Ints
    host_used: Ints
    vm_count: Ints
    generation: Ints
    groups: dict[str, Ints]


class HostState:
    """Providers x classes arrays plus per-host facts; see the module docstring."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._reports_seen: datetime | None = None
        # The cluster clock (seq, layout_seq) these arrays reflect; None: nothing loaded.
        self._clock: tuple[int, int] | None = None
        # Provider id -> the clock value our own last claim there stamped.
        self._own_stamps: dict[int, int] = {}
        self._clear()

    # -- shape -------------------------------------------------------------------------
    def _clear(self) -> None:
        self.provider_ids: Ints = np.zeros(0, np.int64)
        self.provider_names: list[str] = []
        self.row_of: dict[int, int] = {}
        self.root_of: Ints = np.zeros(0, np.int64)  # provider row -> host index
        self.roots: Ints = np.zeros(0, np.int64)  # host index -> provider row
        self.tree: list[list[int]] = []  # host index -> provider rows, root first
        self.flat = True
        self.names: list[str] = []  # host index -> name
        self.uuids: list[str] = []
        self.index: dict[str, int] = {}  # host name or uuid -> host index
        self.classes: dict[str, int] = {}
        self.traits: dict[str, int] = {}
        self.aggregates: dict[str, int] = {}
        p = 0
        self.generation: Ints = np.zeros(0, np.int64)
        self.status: Ints = np.zeros(0, np.int64)
        # Class-major ([class, provider]) so one class over all hosts is contiguous.
        self.capacity: Ints = np.zeros((0, p), np.int64)
        self.used: Ints = np.zeros((0, p), np.int64)
        self.min_unit: Ints = np.zeros((0, p), np.int64)
        self.max_unit: Ints = np.zeros((0, p), np.int64)
        self.step: Ints = np.ones((0, p), np.int64)
        self.host_capacity: Ints = self.capacity
        self.host_used: Ints = self.used
        self.trait_matrix: Bools = np.zeros((p, 0), np.bool_)
        self.aggregate_matrix: Bools = np.zeros((p, 0), np.bool_)
        self.vm_count: Ints = np.zeros(0, np.int64)
        self.load: Floats = np.zeros(0, np.float64)
        self.group_members: dict[str, Ints] = {}
        self._unit_ok: dict[tuple[int, int], Bools] = {}  # also offers(), as (column, -1)
        self.inverse_capacity: Floats = np.zeros((0, 0))
        self._shares: tuple[Ints | None, dict[tuple[int, int], Floats]] = (None, {})

    @property
    def size(self) -> int:
        """How many hosts (root providers) there are to choose from."""
        return len(self.names)

    # -- refreshing --------------------------------------------------------------------
    def refresh(self) -> None:
        """Bring the arrays up to date with the store, reloading only what changed: the
        cluster clock says whether anything did (one row read), and which providers."""
        with self._store.read() as session:
            # Read first: a change committed after it is stamped later and seen next time.
            seen = locking.clock(session)
            if self._clock is None or seen[1] != self._clock[1]:
                self._load_all(session)
            elif seen[0] != self._clock[0]:
                # A provider whose last stamp is our own claim's, at the generation
                # that claim left, holds nothing we have not applied (a write that added
                # usage meanwhile moved its generation too). Some changes move no
                # generation (a Placement client's deletion), hence the stamp.
                changed = [
                    host_id
                    for host_id, stamp, generation in session.execute(
                        select(HostRow.id, HostRow.changed_seq, HostRow.generation).where(
                            HostRow.changed_seq > self._clock[0]
                        )
                    )
                    if self._own_stamps.get(host_id) != stamp
                    or host_id not in self.row_of
                    or self.generation[self.row_of[host_id]] != generation
                ]
                if changed and not self._reload(session, changed):
                    self._load_all(session)
            self._clock = seen
            self._own_stamps.clear()
            self._load_reports(session)

    def refresh_hosts(self, hosts: Iterable[int]) -> None:
        """Reload the named host indexes (after a lost compare-and-swap)."""
        ids = [int(self.provider_ids[p]) for h in hosts for p in self.tree[h]]
        if not ids:
            return
        with self._store.read() as session:
            if not self._reload(session, ids):
                self._load_all(session)

    def _load_all(self, session: Session) -> None:
        self._clear()
        rows = session.execute(
            select(HostRow.id, HostRow.uuid, HostRow.name, HostRow.root_id).order_by(HostRow.id)
        ).all()
        self.provider_ids = np.array([r.id for r in rows], np.int64)
        self.provider_names = [r.name for r in rows]
        self.row_of = {r.id: i for i, r in enumerate(rows)}
        roots = [i for i, r in enumerate(rows) if r.root_id in (None, r.id)]
        self.roots = np.array(roots, np.int64)
        host_of_root = {int(row): h for h, row in enumerate(roots)}
        self.root_of = np.array(
            [host_of_root[self.row_of[r.root_id or r.id]] for r in rows], np.int64
        )
        self.tree = [[] for _ in roots]
        for row, host in enumerate(self.root_of):
            self.tree[int(host)].append(row)  # ids ascend, so the root comes first
        self.flat = len(roots) == len(rows)
        self.names = [rows[r].name for r in roots]
        self.uuids = [rows[r].uuid for r in roots]
        self.index = {name: h for h, name in enumerate(self.names)}
        self.index.update({uuid: h for h, uuid in enumerate(self.uuids)})
        self.classes = {name: c for c, name in enumerate(sorted(lookup.class_ids(session)))}
        self.traits = {
            name: t
            for t, name in enumerate(
                sorted(session.scalars(select(TraitRow.name).join(HostTraitRow).distinct()))
            )
        }
        self.aggregates = {
            name: a
            for a, name in enumerate(
                sorted(session.scalars(select(HostAggregateRow.aggregate).distinct()))
            )
        }
        p, c = len(rows), len(self.classes)
        self.generation = np.zeros(p, np.int64)
        self.status = np.zeros(p, np.int64)
        self.capacity = np.zeros((c, p), np.int64)
        self.used = np.zeros((c, p), np.int64)
        self.min_unit = np.zeros((c, p), np.int64)
        self.max_unit = np.zeros((c, p), np.int64)
        self.step = np.ones((c, p), np.int64)
        self.trait_matrix = np.zeros((p, len(self.traits)), np.bool_)
        self.aggregate_matrix = np.zeros((p, len(self.aggregates)), np.bool_)
        self.vm_count = np.zeros(len(roots), np.int64)
        self.load = np.full(len(roots), np.nan)
        self._reports_seen = None
        loaded = self._reload(session, list(self.row_of))
        assert loaded, "a full load knows every class, trait and aggregate"

    def _reload(self, session: Session, host_ids: Sequence[int]) -> bool:
        """Reload these providers; False when they use a class, trait or aggregate (or a
        tree shape) the arrays have no room for, so the caller must load everything."""
        rows = [self.row_of[i] for i in host_ids]
        names = lookup.class_names(session)
        for chunk in in_chunks(list(host_ids)):
            hosts = session.execute(
                select(HostRow.id, HostRow.generation, HostRow.state, HostRow.root_id).where(
                    HostRow.id.in_(chunk)
                )
            ).all()
            for h in hosts:
                row = self.row_of[h.id]
                if self.provider_ids[self.roots[self.root_of[row]]] != (h.root_id or h.id):
                    return False
                self.generation[row] = h.generation
                self.status[row] = STATE_CODE[h.state]
            chunk_rows = [self.row_of[i] for i in chunk]
            for array in (self.capacity, self.used, self.min_unit, self.max_unit):
                array[:, chunk_rows] = 0
            self.step[:, chunk_rows] = 1
            self.trait_matrix[chunk_rows] = False
            self.aggregate_matrix[chunk_rows] = False
            for inv in session.execute(
                select(*lookup.INVENTORY_COLUMNS).where(InventoryRow.host_id.in_(chunk))
            ):
                column = self.classes.get(names[inv.resource_class_id])
                if column is None:
                    return False
                row = self.row_of[inv.host_id]
                self.capacity[column, row] = lookup.inventory_of(inv).capacity
                self.min_unit[column, row] = inv.min_unit
                self.max_unit[column, row] = inv.max_unit
                self.step[column, row] = inv.step_size
            for (host_id, class_id), used in lookup.used_by_provider(session, chunk).items():
                self.used[self.classes[names[class_id]], self.row_of[host_id]] = (
                    used["active"] + used["pending"]
                )
            for host_id, trait in session.execute(
                select(HostTraitRow.host_id, TraitRow.name)
                .join(TraitRow)
                .where(HostTraitRow.host_id.in_(chunk))
            ):
                if trait not in self.traits:
                    return False
                self.trait_matrix[self.row_of[host_id], self.traits[trait]] = True
            for host_id, aggregate in session.execute(
                select(HostAggregateRow.host_id, HostAggregateRow.aggregate).where(
                    HostAggregateRow.host_id.in_(chunk)
                )
            ):
                if aggregate not in self.aggregates:
                    return False
                self.aggregate_matrix[self.row_of[host_id], self.aggregates[aggregate]] = True
        self._unit_ok.clear()
        hosts_touched = sorted({int(self.root_of[r]) for r in rows})
        self._count_vms(session, hosts_touched)
        if self.flat:
            self.host_capacity, self.host_used = self.capacity, self.used
        else:
            self.host_capacity = self._per_host(self.capacity)
            self.host_used = self._per_host(self.used)
        self.inverse_capacity = np.divide(
            1.0,
            self.host_capacity,
            out=np.zeros(self.host_capacity.shape),
            where=self.host_capacity > 0,
        )
        return True

    def _count_vms(self, session: Session, hosts: list[int]) -> None:
        ids = [int(self.provider_ids[self.roots[h]]) for h in hosts]
        self.vm_count[hosts] = 0
        for chunk in in_chunks(ids):
            placed = VmRow.state.in_(PLACED_STATES)
            here = union_all(
                select(VmRow.host_id.label("host")).where(placed, VmRow.host_id.in_(chunk)),
                select(VmRow.target_host_id.label("host")).where(
                    placed, VmRow.target_host_id.in_(chunk)
                ),
            ).subquery()
            for host_id, count in session.execute(
                select(here.c.host, func.count()).group_by(here.c.host)
            ):
                self.vm_count[self.root_of[self.row_of[host_id]]] = count

    def _load_reports(self, session: Session) -> None:
        query = select(HostReportRow.host_id, HostReportRow.reported_at, HostReportRow.load)
        if self._reports_seen is not None:
            query = query.where(HostReportRow.reported_at > self._reports_seen)
        for host_id, reported_at, load in session.execute(query):
            row = self.row_of.get(host_id)
            if row is None:
                continue
            values = [float(v) for v in load.values()] if load else []
            self.load[self.root_of[row]] = max(values) if values else np.nan
            if self._reports_seen is None or reported_at > self._reports_seen:
                self._reports_seen = reported_at

    def load_groups(self, groups: Collection[GroupRecord]) -> None:
        """Count each group's placed members per host, pending ones included."""
        self.group_members = {g.name: np.zeros(self.size, np.int64) for g in groups}
        if not groups:
            return
        names = {g.name for g in groups}
        with self._store.read() as session:
            rows = session.execute(
                select(ServerGroupRow.name, VmRow.host_id, VmRow.target_host_id)
                .join(VmRow, VmRow.group_id == ServerGroupRow.id)
                .where(ServerGroupRow.name.in_(names), VmRow.state.in_(PLACED_STATES))
            ).all()
        for name, host_id, target_id in rows:
            for provider in (host_id, target_id):
                if provider is not None and provider in self.row_of:
                    self.group_members[name][self.root_of[self.row_of[provider]]] += 1

    # -- views the plugins use ---------------------------------------------------------
    def _per_host(self, matrix: Ints) -> Ints:
        out = np.zeros((matrix.shape[0], self.size), np.int64)
        for column in range(matrix.shape[0]):
            np.add.at(out[column], self.root_of, matrix[column])
        return out

    def any_per_host(self, flags: Bools) -> Bools:
        """Per host: does any provider of its tree have the flag (a trait on a NUMA child)."""
        if self.flat:
            return flags
        return np.bincount(self.root_of, weights=flags, minlength=self.size) > 0

    def host_status(self) -> Ints:
        return self.status[self.roots]

    def unit_ok(self, column: int, amount: int) -> Bools:
        """Providers whose unit rules (min, max, step) allow one allocation of ``amount``."""
        key = (column, amount)
        if key not in self._unit_ok:
            self._unit_ok[key] = (
                (self.min_unit[column] <= amount)
                & (self.max_unit[column] >= amount)
                & (amount % self.step[column] == 0)
            )
        return self._unit_ok[key]

    def offers(self, column: int) -> Bools:
        """Hosts with any inventory of the class."""
        key = (column, -1)
        if key not in self._unit_ok:
            self._unit_ok[key] = self.host_capacity[column] > 0
        return self._unit_ok[key]

    def fits(
        self, amounts: dict[str, int], extra: dict[str, int] | None = None
    ) -> dict[str, Bools]:
        """Per requested class, which hosts can take ``amounts`` (one provider of the tree
        holding the whole amount, as the ledger claims it) plus ``extra`` on top."""
        extra = extra or {}
        out = {}
        for name in amounts.keys() | extra.keys():
            column = self.classes.get(name)
            if column is None:
                out[name] = np.zeros(self.size, np.bool_)
                continue
            amount = amounts.get(name, 0)
            ok = self.capacity[column] - self.used[column] >= amount + extra.get(name, 0)
            if amount:
                ok &= self.unit_ok(column, amount)
            out[name] = self.any_per_host(ok)
        return out

    def share(self, column: int, amount: int, candidates: Ints) -> Floats:
        """(used + amount) / capacity of one class on the candidates: the fill level after
        placing the VM. Weighers of one decision share the arrays (same ``candidates``)."""
        memo_for, memo = self._shares
        if memo_for is not candidates:
            memo = {}
            self._shares = (candidates, memo)
        key = (column, amount)
        if key not in memo:
            memo[key] = (self.host_used[column][candidates] + amount) * self.inverse_capacity[
                column
            ][candidates]
        return memo[key]

    # -- the batch's own decisions -----------------------------------------------------
    def one_node_counts(self, amounts: dict[str, int]) -> Ints:
        """``hw:numa_nodes=1``: per host, how many VMs of ``amounts`` its NUMA nodes (child
        providers) take, each VM's node classes all on one node, as the ledger claims
        them. A host whose nodes offer none of the classes is not limited (int64 max)."""
        unlimited = np.iinfo(np.int64).max
        if self.flat:
            return np.full(self.size, unlimited, np.int64)
        node = np.ones(len(self.root_of), np.bool_)
        node[self.roots] = False
        per_row = np.full(len(self.root_of), unlimited, np.int64)
        limited = np.zeros(self.size, np.bool_)
        for name, amount in amounts.items():
            column = self.classes.get(name)
            if column is None:
                continue  # the resources filter says the class is missing
            on_nodes = self.any_per_host(node & (self.max_unit[column] > 0))
            free = np.maximum(self.capacity[column] - self.used[column], 0)
            count = np.where(self.unit_ok(column, amount), free // amount, 0)
            per_row = np.where(on_nodes[self.root_of], np.minimum(per_row, count), per_row)
            limited |= on_nodes
        per_row = np.where(node & limited[self.root_of], per_row, 0)
        counts = np.zeros(self.size, np.int64)
        np.add.at(counts, self.root_of, per_row)
        return np.where(limited, counts, unlimited)

    def apply(
        self, host: int, amounts: dict[str, int], group: str | None, *, one_node: bool = False
    ) -> None:
        """Record a decided claim as the ledger will write it: each class on the first
        provider of the tree (root first) that holds it; with ``one_node``
        (``hw:numa_nodes=1``) the classes the host's nodes offer on the first node with
        room for all of them."""
        fit = fit_in_tree(
            self.tree[host],
            amounts,
            one_node=one_node,
            offers=lambda row, name: bool(self.max_unit[self.classes[name], row] > 0),
            problem=lambda row, name, amount: (
                "" if self._room(self.classes[name], row, amount) else "full"
            ),
        )
        for row, name, amount in fit.plan:
            self._use(self.classes[name], row, host, amount)
        self.vm_count[host] += 1
        if group is not None and group in self.group_members:
            self.group_members[group][host] += 1

    def _room(self, column: int, row: int, amount: int) -> bool:
        return bool(
            self.capacity[column, row] - self.used[column, row] >= amount
            and self.unit_ok(column, amount)[row]
        )

    def _use(self, column: int, row: int, host: int, amount: int) -> None:
        self.used[column, row] += amount
        if not self.flat:
            self.host_used[column, host] += amount

    def committed(self, hosts: Iterable[int], clock: int | None = None) -> None:
        """Our claims on these hosts landed: the ledger bumped each tree's generations once
        and stamped them with ``clock``, a change the arrays already hold (None: do not
        trust that, read them again)."""
        for host in set(hosts):
            self.generation[self.tree[host]] += 1
            if clock is not None:
                for row in self.tree[host]:
                    self._own_stamps[int(self.provider_ids[row])] = clock

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(
            self.used.copy(),
            self.host_used.copy(),
            self.vm_count.copy(),
            self.generation.copy(),
            {name: counts.copy() for name, counts in self.group_members.items()},
        )

    def restore(self, saved: Checkpoint) -> None:
        self.used = saved.used
        self.host_used = saved.used if self.flat else saved.host_used
        self.vm_count = saved.vm_count
        self.generation = saved.generation
        self.group_members = saved.groups

    def root_generation(self, host: int) -> int:
        return int(self.generation[self.roots[host]])
