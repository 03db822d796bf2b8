"""Placement's reshaper (``POST /reshaper``, 1.30): providers' inventories and consumers'
allocations replaced together, in one transaction, so that usage can move between
providers (a root's VGPU inventory split onto child providers, say) without any moment in
which it is allocated from an inventory that is gone.

In three steps, as Placement's reshaper: each provider first gets the union of its old and
new inventories (nothing removed yet, capacity may fall below use), then the consumers'
allocations are written as ``POST /allocations`` writes them, checked against those
(pending claims counted), then each provider gets exactly its new inventories, a class
still in use refused. Each step moves the providers' generations, as Placement's do.
Any refusal undoes all of it. A VM's consumer is refused: its records follow
the VM's lifecycle (a migration moves them), not a reshape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.host_rows import inventories_of, locked_host, write_inventories
from loadmaster.errors import Conflict, NotFound, UnknownProviderInBody, ValidationError
from loadmaster.pending import consumers
from loadmaster.pending.trees import with_roots
from loadmaster.resources import Inventory
from loadmaster.store.locking import (
    bump_generations,
    lock_hosts,
    lock_vms,
    mark_changed,
    touch_generations,
)


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
    ordered = sorted(inventories, key=lambda i: i.provider)
    rows = []
    for item in ordered:
        row = locked_host(session, item.provider, item.generation)
        interim = {**inventories_of(session, row), **item.inventories}
        write_inventories(session, row, interim, below_use_ok=True)
        bump_generations(session, {row.id: row.generation}, clock=False)
        rows.append(row)
    consumers.write(session, writes)
    for item, row in zip(ordered, rows, strict=True):
        write_inventories(session, row, item.inventories)
    touch_generations(session, [row.id for row in rows])
    mark_changed(session, with_roots(session, {row.id for row in rows}))


def _provider(session: Session, uuid: str) -> lookup.HostRow:
    """A provider whose inventories the reshape replaces; one that does not exist makes
    the body wrong (Placement answers 400 ``placement.resource_provider.not_found``)."""
    try:
        return lookup.host_row(session, uuid, field=f"inventories.{uuid}")
    except NotFound as error:
        raise UnknownProviderInBody(
            error.detail, field=error.field, placement_detail=error.placement_detail
        ) from None
