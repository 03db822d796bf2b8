"""What the scheduler decides on: every host as numpy arrays, with no store behind it.

Rows are providers (root hosts and their children), columns resource classes, so checking
10,000 hosts is a handful of vector operations. A ``Snapshot`` does no I/O: the scheduler's
``SnapshotSource`` (``source.py``) fills one from the store and keeps it current, and a test
builds one from plain host descriptions with ``Snapshot.of``. Filters and weighers read it;
the arrays they get are read-only, so a plugin cannot change what the next one sees. Only
the decision core applies decided claims, to a working copy of the usage it owns
(``working``), which is how each decision of a batch sees the ones before it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from loadmaster.cluster.liveness import DEFAULT_SILENT_AFTER_S
from loadmaster.cluster.records import HOST_STATES
from loadmaster.resources.traits import SHARING_TRAIT
from loadmaster.resources.tree_fit import NODE_CLASSES, Affinity, fit_in_tree, numa_nodes

Ints = npt.NDArray[np.int64]
# Per class, the traits the provider it is taken from must have.
ClassTraits = tuple[tuple[str, frozenset[str]], ...]
Bools = npt.NDArray[np.bool_]
Floats = npt.NDArray[np.float64]

STATE_CODE = {name: code for code, name in enumerate(HOST_STATES)}
ARRAYS = (
    "provider_ids",
    "root_of",
    "parent_row",
    "roots",
    "generation",
    "status",
    "capacity",
    "used",
    "min_unit",
    "max_unit",
    "step",
    "host_capacity",
    "host_used",
    "inverse_capacity",
    "trait_matrix",
    "aggregate_matrix",
    "vm_count",
    "load",
    "agent_seen",
    "agent_listed",
)


@dataclass(frozen=True)
class SyntheticHost:
    """One host for ``Snapshot.of``: inventories as capacities (after reserved and ratio),
    what is used of them, and the host's children (NUMA nodes, devices; a node's devices
    as its own children) as more ``SyntheticHost``s.
    ``units`` gives a class's (min_unit, max_unit, step); the default allows any amount."""

    name: str
    capacity: Mapping[str, int] = field(default_factory=dict)
    used: Mapping[str, int] = field(default_factory=dict)
    traits: Iterable[str] = ()
    aggregates: Iterable[str] = ()
    state: str = "up"
    vm_count: int = 0
    load: float | None = None
    units: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    children: Sequence[SyntheticHost] = ()
    generation: int = 0
    # When its agent was last heard from (seconds since the epoch); None: no agent.
    agent_seen: float | None = None
    # Whether its agent's host manager has read its work list since it started.
    agent_listed: bool = True


class Snapshot:
    """Providers x classes arrays plus per-host facts; see the module docstring."""

    def __init__(self) -> None:
        self.provider_ids: Ints = np.zeros(0, np.int64)
        self.provider_names: list[str] = []
        self.row_of: dict[int, int] = {}  # provider id -> row
        self.root_of: Ints = np.zeros(0, np.int64)  # provider row -> host index
        self.parent_row: Ints = np.zeros(0, np.int64)  # provider row -> its parent's, -1
        self.roots: Ints = np.zeros(0, np.int64)  # host index -> provider row
        self.tree: list[list[int]] = []  # host index -> provider rows, root first
        self.flat = True
        self.names: list[str] = []  # host index -> name
        self.uuids: list[str] = []
        self.index: dict[str, int] = {}  # host name or uuid -> host index
        self.classes: dict[str, int] = {}
        self.traits: dict[str, int] = {}
        self.aggregates: dict[str, int] = {}
        self.generation: Ints = np.zeros(0, np.int64)
        self.status: Ints = np.zeros(0, np.int64)
        # Class-major ([class, provider]) so one class over all hosts is contiguous.
        self.capacity: Ints = np.zeros((0, 0), np.int64)
        self.used: Ints = np.zeros((0, 0), np.int64)
        self.min_unit: Ints = np.zeros((0, 0), np.int64)
        self.max_unit: Ints = np.zeros((0, 0), np.int64)
        self.step: Ints = np.ones((0, 0), np.int64)
        self.host_capacity: Ints = self.capacity
        self.host_used: Ints = self.used
        self.inverse_capacity: Floats = np.zeros((0, 0))
        self.trait_matrix: Bools = np.zeros((0, 0), np.bool_)
        self.aggregate_matrix: Bools = np.zeros((0, 0), np.bool_)
        # Sharing providers (``SHARING_TRAIT``: a storage pool several hosts mount): their
        # rows, and per host which of them its tree reaches through an aggregate.
        self.sharing_rows: Ints = np.zeros(0, np.int64)
        self.reach: Bools = np.zeros((0, 0), np.bool_)
        self.sharing: dict[int, list[int]] = {}
        self.vm_count: Ints = np.zeros(0, np.int64)
        self.load: Floats = np.zeros(0, np.float64)
        # Per host: when its agent was last heard from (seconds since the epoch), NaN for
        # no agent; whether any host has an agent (a deployment without agents schedules
        # on every host); the time the snapshot was taken and the agents' silence limit.
        self.agent_seen: Floats = np.zeros(0, np.float64)
        # Per host: whether its host manager read its work list since it (re)started
        # (True for an agent that never said which run it is).
        self.agent_listed: Bools = np.zeros(0, np.bool_)
        self.agents_in_use = False
        # A working copy: whether any host reported a load (None: not worked out).
        self.any_load: bool | None = None
        self.taken_at = 0.0
        self.agent_silent_after = DEFAULT_SILENT_AFTER_S
        # Per server group of the call: its placed members (pending counted) per host.
        self.group_members: dict[str, Ints] = {}
        # Caches of pure functions of the arrays above (cleared whenever they change);
        # _unit_ok also holds offers() as (column, -1), offered_everywhere() as (column, -2).
        self._unit_ok: dict[tuple[int, int], Bools] = {}
        self._tree_nodes: dict[int, list[int | None]] = {}  # host -> tree_nodes(host)
        self._shares: tuple[Ints | None, dict[tuple[int, int], Floats]] = (None, {})

    @property
    def size(self) -> int:
        """How many hosts (root providers) there are to choose from."""
        return len(self.names)

    # -- building ----------------------------------------------------------------------
    @classmethod
    def of(
        cls, hosts: Sequence[SyntheticHost], groups: Mapping[str, Mapping[str, int]] | None = None
    ) -> Snapshot:
        """A snapshot of made-up hosts, for tests and for trying a plugin: ``groups`` maps
        a server group's name to its members per host name."""
        snap = cls()
        providers: list[tuple[SyntheticHost, int]] = []  # (provider, host index)
        parents: list[int] = []
        roots = []

        def add(provider: SyntheticHost, h: int, parent: int) -> None:
            row = len(providers)
            providers.append((provider, h))
            parents.append(parent)
            for child in provider.children:
                add(child, h, row)

        for h, host in enumerate(hosts):
            roots.append(len(providers))
            add(host, h, -1)
        names = sorted({c for p, _ in providers for c in (*p.capacity, *p.used, *p.units)})
        traits = sorted({t for p, _ in providers for t in p.traits})
        aggregates = sorted({a for p, _ in providers for a in p.aggregates})
        snap.provider_ids = np.arange(1, len(providers) + 1, dtype=np.int64)
        snap.provider_names = [p.name for p, _ in providers]
        snap.row_of = {int(i): row for row, i in enumerate(snap.provider_ids)}
        snap.root_of = np.array([h for _, h in providers], np.int64)
        snap.parent_row = np.array(parents, np.int64)
        snap.roots = np.array(roots, np.int64)
        snap.tree = [[] for _ in hosts]
        for row, (_, h) in enumerate(providers):
            snap.tree[h].append(row)
        snap.flat = len(providers) == len(hosts)
        snap.names = [host.name for host in hosts]
        snap.uuids = [f"00000000-0000-0000-0000-{h:012d}" for h in range(len(hosts))]
        snap.index = {n: h for h, n in enumerate(snap.names)}
        snap.index.update({u: h for h, u in enumerate(snap.uuids)})
        snap.classes = {name: c for c, name in enumerate(names)}
        snap.traits = {name: t for t, name in enumerate(traits)}
        snap.aggregates = {name: a for a, name in enumerate(aggregates)}
        p, c = len(providers), len(names)
        snap.generation = np.array([pr.generation for pr, _ in providers], np.int64)
        snap.status = np.array([STATE_CODE[pr.state] for pr, _ in providers], np.int64)
        snap.capacity = np.zeros((c, p), np.int64)
        snap.used = np.zeros((c, p), np.int64)
        snap.min_unit = np.zeros((c, p), np.int64)
        snap.max_unit = np.zeros((c, p), np.int64)
        snap.step = np.ones((c, p), np.int64)
        snap.trait_matrix = np.zeros((p, len(traits)), np.bool_)
        snap.aggregate_matrix = np.zeros((p, len(aggregates)), np.bool_)
        for row, (pr, _) in enumerate(providers):
            for name, total in pr.capacity.items():
                column = snap.classes[name]
                low, high, step = pr.units.get(name, (1, total, 1))
                snap.capacity[column, row] = total
                snap.min_unit[column, row], snap.max_unit[column, row] = low, high
                snap.step[column, row] = step
            for name, amount in pr.used.items():
                snap.used[snap.classes[name], row] = amount
            for trait in pr.traits:
                snap.trait_matrix[row, snap.traits[trait]] = True
            for aggregate in pr.aggregates:
                snap.aggregate_matrix[row, snap.aggregates[aggregate]] = True
        snap.vm_count = np.array([host.vm_count for host in hosts], np.int64)
        snap.load = np.array([np.nan if h.load is None else h.load for h in hosts], np.float64)
        snap.agent_seen = np.array(
            [np.nan if h.agent_seen is None else h.agent_seen for h in hosts], np.float64
        )
        snap.agent_listed = np.array([h.agent_listed for h in hosts], np.bool_)
        snap.agents_in_use = any(h.agent_seen is not None for h in hosts)
        snap.taken_at = time.time()
        for group, members in (groups or {}).items():
            counts = np.zeros(len(hosts), np.int64)
            for name, count in members.items():
                counts[snap.index[name]] = count
            snap.group_members[group] = counts
        snap.derive()
        snap.freeze()
        return snap

    def derive(self) -> None:
        """Recompute what follows from the provider arrays: per-host sums (a host's tree
        as one) and the inverse capacities the weighers scale by."""
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
        self._unit_ok.clear()
        self._tree_nodes.clear()
        self._shares = (None, {})
        self._derive_sharing()

    def _derive_sharing(self) -> None:
        trait = self.traits.get(SHARING_TRAIT)
        rows = (
            np.zeros(0, np.int64) if trait is None else np.flatnonzero(self.trait_matrix[:, trait])
        )
        self.sharing_rows = rows
        self.reach = np.zeros((self.size, len(rows)), np.bool_)
        for k, row in enumerate(rows.tolist()):
            columns = np.flatnonzero(self.aggregate_matrix[row])
            members = self.any_per_host(np.asarray(self.aggregate_matrix[:, columns].any(axis=1)))
            members[self.root_of[row]] = False  # its own tree holds it already
            self.reach[:, k] = members
        self.sharing = {
            int(h): self.sharing_rows[self.reach[h]].tolist()
            for h in np.flatnonzero(self.reach.any(axis=1))
        }

    def freeze(self, frozen: bool = True) -> None:
        """Make every array read-only (or writable again, for whoever owns them)."""
        for array in (*(getattr(self, name) for name in ARRAYS), *self.group_members.values()):
            array.setflags(write=not frozen)  # (half the cost of ``flags.writeable =``)

    def working(self) -> Snapshot:
        """A copy whose usage (and group counts) can take claims, sharing everything else."""
        twin = copy.copy(self)
        twin.used = self.used.copy()
        twin.host_used = twin.used if self.flat else self.host_used.copy()
        twin.vm_count = self.vm_count.copy()
        twin.group_members = {name: c.copy() for name, c in self.group_members.items()}
        twin._shares = (None, {})
        twin.any_load = bool((~np.isnan(self.load)).any())  # (loads do not change in a call)
        return twin

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
            offered = self.host_capacity[column] > 0
            if self.sharing:
                offered = offered | self._reached(self.capacity[column, self.sharing_rows] > 0)
            self._unit_ok[key] = offered
        return self._unit_ok[key]

    def _reached(self, sharing_ok: Bools, at: Ints | None = None) -> Bools:
        """Per host (of ``at``): does it reach a sharing provider ``sharing_ok`` marks."""
        reach = self.reach if at is None else self.reach[at]
        return np.asarray(reach[:, sharing_ok].any(axis=1))

    def offered_everywhere(self, column: int) -> bool:
        """Does every host have inventory of the class."""
        key = (column, -2)
        if key not in self._unit_ok:
            self._unit_ok[key] = np.array(self.offers(column).all())
        return bool(self._unit_ok[key])

    def rows_of(self, at: Ints) -> tuple[Ints, Ints | None]:
        """The provider rows of the hosts ``at`` (their trees, root first) and, per row,
        its host's position in ``at`` (None when every host is one provider)."""
        if self.flat:
            return at, None  # (row h is host h)
        trees = [self.tree[h] for h in at.tolist()]
        rows = np.fromiter((r for tree in trees for r in tree), np.int64)
        return rows, np.repeat(np.arange(len(at)), [len(tree) for tree in trees])

    def fits(
        self,
        amounts: Mapping[str, int],
        extra: Mapping[str, int] | None = None,
        at: Ints | None = None,
        held: Sequence[tuple[str, int]] = (),
    ) -> dict[str, Bools]:
        """Per requested class, which hosts can take ``amounts`` (one provider of the tree
        holding the whole amount, as the ledger claims it) plus ``extra`` on top. With
        ``at``, only for those hosts (one entry per host of ``at``). ``held``: classes a
        running VM holds on sharing providers (``VmRequest.shared_held``), which a host
        reaching that provider needs no room for."""
        extra = extra or {}
        out = {}
        rows: Ints | slice = slice(None)
        owner: Ints | None = None
        if at is not None:
            rows, owner = self.rows_of(at)
        size = self.size if at is None else len(at)
        for name in amounts.keys() | extra.keys():
            column = self.classes.get(name)
            if column is None:
                out[name] = np.zeros(size, np.bool_)
                continue
            amount = amounts.get(name, 0)
            ok = self.capacity[column][rows] - self.used[column][rows] >= amount + extra.get(
                name, 0
            )
            if amount:
                ok &= self.unit_ok(column, amount)[rows]
            if at is None:
                out[name] = self.any_per_host(ok)
            elif owner is None:
                out[name] = ok
            else:
                out[name] = np.bincount(owner, weights=ok, minlength=size) > 0
            if self.sharing:
                shared = self.sharing_rows
                room = self.capacity[column][shared] - self.used[column][shared]
                shared_ok = room >= amount + extra.get(name, 0)
                if amount:
                    shared_ok &= self.unit_ok(column, amount)[shared]
                out[name] = out[name] | self._reached(shared_ok, at)
        for name, row in held:
            if name in out:
                out[name] = out[name] | self._reached(self.sharing_rows == row, at)
        return out

    def unheld(
        self, host: int, amounts: Mapping[str, int], held: Sequence[tuple[str, int]]
    ) -> Mapping[str, int]:
        """``amounts`` less the classes held on a sharing provider ``host`` reaches: what
        a migration there claims (the ledger keeps the rest where it is)."""
        reached = self.sharing.get(host)
        if not held or not reached:
            return amounts
        kept = {name for name, row in held if row in reached}
        return {name: amount for name, amount in amounts.items() if name not in kept}

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

    def one_node_counts(self, amounts: Mapping[str, int]) -> Ints:
        """``hw:numa_nodes=1``: per host, how many VMs of ``amounts`` its NUMA nodes (child
        providers) take, each VM's node classes all on one node, as the ledger claims
        them. A host whose nodes offer none of the classes is not limited (int64 max)."""
        unlimited = np.iinfo(np.int64).max
        if self.flat:
            return np.full(self.size, unlimited, np.int64)
        node = self.numa_node_rows()
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

    def numa_node_rows(self) -> Bools:
        """Which provider rows are NUMA nodes: children of their root offering CPUs or
        memory (``tree_fit.NODE_CLASSES``), not devices."""
        offers = np.zeros(len(self.root_of), np.bool_)
        for name in NODE_CLASSES:
            column = self.classes.get(name)
            if column is not None:
                offers |= self.max_unit[column] > 0
        # (A root's parent is -1, never its own row.)
        return offers & (self.parent_row == self.roots[self.root_of])

    def tree_nodes(self, host: int) -> list[int | None]:
        """``tree_fit.numa_nodes`` of the host's tree (asked at every claim a batch
        applies: read from its rows only, and kept until the inventories change)."""
        known = self._tree_nodes.get(host)
        if known is not None:
            return known
        rows = self.tree[host]
        index = {row: i for i, row in enumerate(rows)}
        columns = [self.classes[name] for name in NODE_CLASSES if name in self.classes]
        offers = [any(self.max_unit[c, row] > 0 for c in columns) for row in rows]
        nodes = numa_nodes([index.get(int(self.parent_row[row])) for row in rows], offers)
        self._tree_nodes[host] = nodes
        return nodes

    # -- claims ------------------------------------------------------------------------
    def apply(
        self,
        host: int,
        amounts: Mapping[str, int],
        group: str | None,
        *,
        one_node: bool = False,
        affinity: Affinity | None = None,
        class_traits: ClassTraits = (),
        held: Sequence[tuple[str, int]] = (),
    ) -> None:
        """Record a claim as the ledger will write it: each class on the first provider of
        the tree (root first) that holds it, else on a sharing provider the host reaches; with ``one_node`` (``hw:numa_nodes=1``) the
        classes the host's nodes offer on the first node with room for all of them (and
        its devices as ``affinity`` says); a class ``held`` on a sharing provider the
        host reaches is not claimed again (``unheld``). Only for a working copy, or for the owner of
        the arrays (the snapshot source)."""
        amounts = self.unheld(host, amounts, held)
        for row, column, amount in self.placing(host, amounts, one_node, affinity, class_traits):
            self.used[column, row] += amount
            if not self.flat:
                # (A sharing provider's row counts for its own tree, not the claim's host.)
                self.host_used[column, self.root_of[row]] += amount
        self.vm_count[host] += 1
        if group is not None and group in self.group_members:
            self.group_members[group][host] += 1
        self._shares = (None, {})

    def placing(
        self,
        host: int,
        amounts: Mapping[str, int],
        one_node: bool,
        affinity: Affinity | None = None,
        class_traits: ClassTraits = (),
    ) -> list[tuple[int, int, int]]:
        """Where ``fit_in_tree`` puts the amounts, as (row, column, amount); nothing if
        they do not fit."""
        shared = self.sharing.get(host, [])
        if self.flat and not class_traits and not shared:
            # A tree of one provider: every class on it, if it offers and has room for
            # each (fit_in_tree's answer, without its generality).
            plan = []
            for name, amount in sorted(amounts.items()):
                column = self.classes[name]
                if not (self.max_unit[column, host] > 0 and self._room(column, host, amount)):
                    return []
                plan.append((host, column, amount))
            return plan
        bound = {name: [self.traits.get(t, -1) for t in traits] for name, traits in class_traits}

        def offers(row: int, name: str) -> bool:
            return bool(self.max_unit[self.classes[name], row] > 0) and all(
                t >= 0 and self.trait_matrix[row, t] for t in bound.get(name, ())
            )

        fit = fit_in_tree(
            self.tree[host] + shared,
            amounts,
            one_node=one_node,
            offers=offers,
            problem=lambda row, name, amount: (
                "" if self._room(self.classes[name], row, amount) else "full"
            ),
            node_of=self.tree_nodes(host) + [None] * len(shared),
            affinity=affinity,
        )
        return [(row, self.classes[name], amount) for row, name, amount in fit.plan]

    def _room(self, column: int, row: int, amount: int) -> bool:
        return bool(
            self.capacity[column, row] - self.used[column, row] >= amount
            and self.unit_ok(column, amount)[row]
        )
