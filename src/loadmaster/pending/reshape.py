"""Placement's reshaper (``POST /reshaper``, 1.30): providers' inventories and consumers'
allocations replaced together, in one transaction, so that usage can move between
providers (a root's VGPU inventory split onto child providers, say) without any moment in
which it is allocated from an inventory that is gone.

The inventories are written first, with the records of the consumers being rewritten left
out of the in-use check; then those consumers' allocations are written as ``PUT
/allocations`` writes them, each checked against the new inventories (pending claims
counted). Any refusal undoes all of it. A VM's consumer is refused: its records follow
the VM's lifecycle (a migration moves them), not a reshape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.host_rows import locked_host, write_inventories
from loadmaster.errors import Conflict, NotFound, UnknownProviderInBody, ValidationError
from loadmaster.pending import consumers
from loadmaster.pending.trees import with_roots
from loadmaster.resources import Inventory
from loadmaster.store.locking import bump_generations, lock_hosts, lock_vms, mark_changed


@dataclass(frozen=True)
class ProviderInventories:
    """One provider's whole new inventory set, at the generation the client saw."""

    provider: str
    generation: int
    inventories: Mapping[str, Inventory]


def reshape(
    session: Session,
    inventories: Sequence[ProviderInventories],
    writes: Sequence[consumers.ConsumerWrite],
) -> None:
    """Everything or nothing, in the caller's transaction."""
    names = [w.consumer for w in writes]
    vms = lock_vms(session, names)
    if vms:
        first = sorted(vms)[0]
        raise Conflict(
            f"allocations.{first}: consumer {first} is a loadmaster VM; its allocations move "
            "with the VM (migrate it), not by a reshape",
            field=f"allocations.{first}",
        )
    # The lock order of Placement writes: consumers, then providers, the clock last.
    moving = consumers.lock_consumers(session, names)
    lock_hosts(
        session,
        with_roots(
            session,
            {_provider(session, i.provider).id for i in inventories}
            | consumers.hosts_touched(session, writes, moving),
        ),
    )
    known = lookup.class_ids(session)
    for item in inventories:
        for name in item.inventories:
            if name not in known:
                # The body is wrong, not a path to nothing: Placement's 400 and words.
                raise ValidationError(
                    f"No such resource class {name}.",
                    field=f"inventories.{item.provider}.inventories.{name}",
                )
    reshaped = []
    for item in sorted(inventories, key=lambda i: i.provider):
        row = locked_host(session, item.provider, item.generation)
        write_inventories(session, row, item.inventories, moving)
        bump_generations(session, {row.id: row.generation}, clock=False)
        reshaped.append(row.id)
    consumers.write(session, writes)
    mark_changed(session, with_roots(session, set(reshaped)))


def _provider(session: Session, uuid: str) -> lookup.HostRow:
    """A provider whose inventories the reshape replaces; one that does not exist makes
    the body wrong (Placement answers 400 ``placement.resource_provider.not_found``)."""
    try:
        return lookup.host_row(session, uuid, field=f"inventories.{uuid}")
    except NotFound as error:
        raise UnknownProviderInBody(error.detail, field=error.field) from None
