"""A host's provider tree as a claim reads it inside its transaction, and the tree queries
the ledger's other parts share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    BindParameter,
    Float,
    Integer,
    Select,
    bindparam,
    cast,
    func,
    literal_column,
    null,
    select,
    union_all,
)
from sqlalchemy.orm import Session, aliased

from loadmaster.resources import Inventory
from loadmaster.resources.traits import SHARING_TRAIT
from loadmaster.resources.tree_fit import NODE_CLASSES, numa_nodes
from loadmaster.store import Prepared, run, run_chunked
from loadmaster.store.chunks import in_chunks
from loadmaster.store.locking import execute_core
from loadmaster.store.schema import (
    AllocationRow,
    HostAggregateRow,
    HostRow,
    HostTraitRow,
    InventoryRow,
    ResourceClassRow,
    TraitRow,
)
from loadmaster.store.transaction import Transaction


class Named(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ProviderRow:
    """What a claim reads of a provider's row: a plain record, not an ORM entity (a claim
    reads a few of them per VM, and an entity costs several times a row)."""

    id: int
    uuid: str
    name: str
    state: str
    parent_id: int | None
    root_id: int | None
    generation: int


PROVIDER_COLUMNS = (
    HostRow.id,
    HostRow.uuid,
    HostRow.name,
    HostRow.state,
    HostRow.parent_id,
    HostRow.root_id,
    HostRow.generation,
)


def provider_rows(rows: Iterable[Any]) -> list[ProviderRow]:
    """Rows selected with ``PROVIDER_COLUMNS``, as records."""
    return [ProviderRow(*row) for row in rows]


@dataclass
class ProviderTree:
    """One root host and its child providers (root first), their inventories and what is
    used of them, active and pending."""

    root: ProviderRow
    providers: list[ProviderRow]
    inventories: dict[tuple[int, int], Inventory] = field(default_factory=dict)
    used: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)
    # Every trait of any provider of the tree: a flavor's traits hold for the host when a
    # provider of it has them (as the scheduler's traits filter reads them).
    traits: set[str] = field(default_factory=set)
    # Each provider's own traits, by provider id.
    provider_traits: dict[int, set[str]] = field(default_factory=dict)
    # The ids of the classes the tree has inventory of, by name.
    class_ids: dict[str, int] = field(default_factory=dict)
    # The sharing providers of other trees in an aggregate with a provider of this one:
    # id -> its root's id (read only when asked: ``load_trees(sharing=True)``).
    reaches: dict[int, int] = field(default_factory=dict)

    def numa_nodes(self) -> list[int | None] | None:
        """``tree_fit.numa_nodes`` of the tree (None for a tree of one provider)."""
        if len(self.providers) == 1:
            return None
        index = {p.id: i for i, p in enumerate(self.providers)}
        node_ids = {self.class_ids[c] for c in NODE_CLASSES if c in self.class_ids}
        return numa_nodes(
            [index.get(p.parent_id) if p.parent_id is not None else None for p in self.providers],
            [any((p.id, c) in self.inventories for c in node_ids) for p in self.providers],
        )

    def problem(self, provider: Named, name: str, class_id: int, amount: int) -> str:
        """Why ``provider`` cannot hold ``amount`` of the class now ("" when it can)."""
        inventory = self.inventories.get((provider.id, class_id))
        if inventory is None:
            return f"{name} on {provider.name}: no inventory"
        used = self.used.get((provider.id, class_id), {})
        active, pending = used.get("active", 0), used.get("pending", 0)
        problem = inventory.room_problem(amount, active + pending)
        if problem is None:
            return ""
        if inventory.unit_problem(amount) is None:  # short of room: say what holds it
            problem += f" ({active} active, {pending} pending)"
        return f"{name} on {provider.name}: {problem}"


def load_trees(
    session: Transaction,
    root_ids: set[int],
    providers: Sequence[ProviderRow] | None = None,
    *,
    sharing: bool = False,
) -> dict[int, ProviderTree]:
    """The trees of these roots, with their inventories, usage and traits. ``providers``:
    the trees' host rows, already read by the caller (every provider of each root, in id
    order); else they are read here. ``sharing``: each tree also takes the sharing
    providers it reaches (``_add_sharing``), found in the same statement (a claim's: one
    round trip fewer than a query of its own)."""
    if providers is None:
        providers = provider_rows(
            execute_core(
                session,
                select(*PROVIDER_COLUMNS).where(HostRow.root_id.in_(root_ids)).order_by(HostRow.id),
            )
        )
    trees: dict[int, ProviderTree] = {}
    for p in providers:
        if p.id == p.root_id:
            trees[p.id] = ProviderTree(root=p, providers=[])
    for p in providers:
        trees[p.root_id or p.id].providers.append(p)  # root first: its id is the smallest
    root_of = {p.id: p.root_id or p.id for p in providers}
    for chunk in in_chunks(list(root_of)):
        # Inventories (with their class names), usage summed from the records, and traits:
        # one statement, told apart by ``kind``.
        for kind, host_id, class_id, name, a, b, c, d, e, ratio in run(
            session, _TREE_CONTENTS_REACHING if sharing else _TREE_CONTENTS, {"ids": chunk}
        ):
            tree = trees[root_of[host_id]]
            if kind == SHARES:
                tree.reaches[a] = class_id
            elif kind == INVENTORY:
                tree.inventories[(host_id, class_id)] = Inventory(a, b, c, d, e, ratio)
                tree.class_ids[name] = class_id
            elif kind == USED:
                tree.used.setdefault((host_id, class_id), {"active": 0, "pending": 0})[name] = int(
                    a
                )
            else:
                tree.traits.add(name)
                tree.provider_traits.setdefault(host_id, set()).add(name)
    if sharing:
        _add_sharing(session, trees)
    return trees


INVENTORY, USED, TRAIT = 0, 1, 2
# A provider of the tree shares an aggregate with a sharing provider of another tree
# (``a``: its id; ``class_id``: its root's).
SHARES = 3
IDS: BindParameter[Any] = bindparam("ids", expanding=True)
NO_INT = cast(null(), BigInteger)


def sparse_row(
    kind: int,
    host_id: Any,
    name: Any,
    *,
    class_id: Any = None,
    a: Any = NO_INT,
) -> tuple[Any, ...]:
    """The columns of a contents branch that says no more than a provider, a name, and
    perhaps a class and one amount; the other columns are typed NULLs."""
    return (
        literal_column(str(kind)),
        host_id,
        cast(null(), Integer) if class_id is None else class_id,
        name,
        a,
        NO_INT,
        NO_INT,
        NO_INT,
        NO_INT,
        cast(null(), Float),
    )


# A provider's contents, one row each, told apart by ``kind``: (kind, host_id, class_id,
# name, a, b, c, d, e, ratio). The snapshot's reload adds branches of its own.
TREE_BRANCHES: tuple[Select[*tuple[Any, ...]], ...] = (
    select(
        literal_column(str(INVENTORY)).label("kind"),
        InventoryRow.host_id,
        InventoryRow.resource_class_id.label("class_id"),
        ResourceClassRow.name.label("name"),
        InventoryRow.total.label("a"),
        InventoryRow.reserved.label("b"),
        InventoryRow.min_unit.label("c"),
        InventoryRow.max_unit.label("d"),
        InventoryRow.step_size.label("e"),
        InventoryRow.allocation_ratio.label("ratio"),
    )
    .join(ResourceClassRow, ResourceClassRow.id == InventoryRow.resource_class_id)
    .where(InventoryRow.host_id.in_(IDS)),
    select(
        *sparse_row(
            USED,
            AllocationRow.host_id,
            AllocationRow.state,
            class_id=AllocationRow.resource_class_id,
            a=cast(func.sum(AllocationRow.amount), BigInteger),
        )
    )
    .where(AllocationRow.host_id.in_(IDS))
    .group_by(AllocationRow.host_id, AllocationRow.resource_class_id, AllocationRow.state),
    select(*sparse_row(TRAIT, HostTraitRow.host_id, TraitRow.name))
    .join(TraitRow, TraitRow.id == HostTraitRow.trait_id)
    .where(HostTraitRow.host_id.in_(IDS)),
)
_TREE_CONTENTS = Prepared(union_all(*TREE_BRANCHES))


def tree_ids(session: Session, root_id: int | None) -> set[int]:
    return set(session.scalars(select(HostRow.id).where(HostRow.root_id == root_id)))


def with_roots(session: Transaction, host_ids: set[int]) -> set[int]:
    """The touched providers and their roots: a change under a root is a change of its host."""
    rows = execute_core(
        session, select(HostRow.id, HostRow.root_id).where(HostRow.id.in_(host_ids))
    ).all()
    return set(host_ids) | {root for _, root in rows if root}


_MINE = aliased(HostRow)
_THEIRS = aliased(HostAggregateRow)


def _reaching(*columns: Any) -> Select[Any]:
    """``columns`` of each pair of a provider (``_MINE``) and a sharing provider
    (``HostRow``) of another tree in an aggregate with it."""
    return (
        select(*columns)
        .distinct()
        .join(HostAggregateRow, HostAggregateRow.host_id == _MINE.id)
        .join(_THEIRS, _THEIRS.aggregate == HostAggregateRow.aggregate)
        .join(HostRow, HostRow.id == _THEIRS.host_id)
        .join(HostTraitRow, HostTraitRow.host_id == HostRow.id)
        .join(TraitRow, TraitRow.id == HostTraitRow.trait_id)
        .where(
            TraitRow.name == SHARING_TRAIT,
            func.coalesce(HostRow.root_id, HostRow.id) != func.coalesce(_MINE.root_id, _MINE.id),
        )
    )


# Built once: a claim asks them for every batch, and building one took longer than
# running it.
_TREE_CONTENTS_REACHING = Prepared(
    union_all(
        *TREE_BRANCHES,
        _reaching(
            *sparse_row(
                SHARES,
                _MINE.id,
                TraitRow.name,
                class_id=func.coalesce(HostRow.root_id, HostRow.id),
                a=cast(HostRow.id, BigInteger),
            )
        ).where(_MINE.id.in_(IDS)),
    )
)
_SHARING_REACHED = Prepared(
    _reaching(func.coalesce(_MINE.root_id, _MINE.id), *PROVIDER_COLUMNS)
    .where(func.coalesce(_MINE.root_id, _MINE.id).in_(IDS))
    .order_by(HostRow.id)
)


def sharing_reached(session: Transaction, root_ids: set[int]) -> dict[int, list[ProviderRow]]:
    """Per root: the sharing providers (``SHARING_TRAIT``) of other trees in an aggregate
    with a provider of its tree, in id order (roots reaching none are left out)."""
    out: dict[int, list[ProviderRow]] = {}
    if not root_ids:
        return out
    for root, *provider in run_chunked(session, _SHARING_REACHED, "ids", sorted(root_ids)):
        out.setdefault(root, []).append(ProviderRow(*provider))
    for providers in out.values():
        providers.sort(key=lambda p: p.id)
    return out


def _add_sharing(session: Transaction, trees: Mapping[int, ProviderTree]) -> None:
    """Each tree takes, after its own providers, the sharing providers it reaches, with
    their inventories and usage: a class no provider of the tree offers is claimed there,
    as Placement's allocation candidates take it. Trees reaching one sharing provider
    share its usage, so the claims of one batch see each other's."""
    roots = {root for tree in trees.values() for root in tree.reaches.values()}
    if not roots:
        return
    contents = load_trees(session, roots)
    for tree in contents.values():
        for key in tree.inventories:
            tree.used.setdefault(key, {"active": 0, "pending": 0})
    sharing = {p.id: p for source in contents.values() for p in source.providers}
    for tree in trees.values():
        for provider in (sharing[i] for i in sorted(tree.reaches)):
            source = contents[provider.root_id or provider.id]
            tree.providers.append(provider)
            for key, inventory in source.inventories.items():
                if key[0] == provider.id:
                    tree.inventories[key] = inventory
                    tree.used[key] = source.used[key]
            tree.class_ids.update(source.class_ids)
            tree.provider_traits[provider.id] = source.provider_traits.get(provider.id, set())


def reached_ids(session: Transaction, root_id: int | None) -> set[int]:
    """The ids of the sharing providers ``root_id``'s tree reaches."""
    if root_id is None:
        return set()
    return {p.id for p in sharing_reached(session, {root_id}).get(root_id, [])}
