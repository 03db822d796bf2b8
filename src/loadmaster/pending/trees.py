"""A host's provider tree as a claim reads it inside its transaction, and the tree queries
the ledger's other parts share."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.resources import Inventory
from loadmaster.store.schema import HostRow, HostTraitRow, InventoryRow, TraitRow


@dataclass
class ProviderTree:
    """One root host and its child providers (root first), their inventories and what is
    used of them, active and pending."""

    root: HostRow
    providers: list[HostRow]
    inventories: dict[tuple[int, int], Inventory] = field(default_factory=dict)
    used: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)
    # Every trait of any provider of the tree: a flavor's traits hold for the host when a
    # provider of it has them (as the scheduler's traits filter reads them).
    traits: set[str] = field(default_factory=set)

    def problem(self, provider: HostRow, name: str, class_id: int, amount: int) -> str:
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


def load_trees(session: Session, root_ids: set[int]) -> dict[int, ProviderTree]:
    providers = list(
        session.scalars(select(HostRow).where(HostRow.root_id.in_(root_ids)).order_by(HostRow.id))
    )
    trees: dict[int, ProviderTree] = {}
    for p in providers:
        if p.id == p.root_id:
            trees[p.id] = ProviderTree(root=p, providers=[])
    for p in providers:
        trees[p.root_id or p.id].providers.append(p)  # root first: its id is the smallest
    root_of = {p.id: p.root_id or p.id for p in providers}
    sums = lookup.used_by_provider(session, root_of)
    for inv in session.execute(
        select(*lookup.INVENTORY_COLUMNS).where(InventoryRow.host_id.in_(root_of))
    ):
        key = (inv.host_id, inv.resource_class_id)
        trees[root_of[inv.host_id]].inventories[key] = lookup.inventory_of(inv)
    for (host_id, class_id), used in sums.items():
        trees[root_of[host_id]].used[(host_id, class_id)] = used
    for host_id, trait in session.execute(
        select(HostTraitRow.host_id, TraitRow.name)
        .join(TraitRow, TraitRow.id == HostTraitRow.trait_id)
        .where(HostTraitRow.host_id.in_(root_of))
    ):
        trees[root_of[host_id]].traits.add(trait)
    return trees


def tree_ids(session: Session, root_id: int | None) -> set[int]:
    return set(session.scalars(select(HostRow.id).where(HostRow.root_id == root_id)))


def with_roots(session: Session, host_ids: set[int]) -> set[int]:
    """The touched providers and their roots: a change under a root is a change of its host."""
    rows = session.execute(
        select(HostRow.id, HostRow.root_id).where(HostRow.id.in_(host_ids))
    ).all()
    return set(host_ids) | {root for _, root in rows if root}
