"""Hosts' work lists: every VM the ledger puts on a host, and what its agent must do about
it, read for many hosts at once.

One read answers a batch of hosts with a fixed number of statements (their rows, their
VMs, and what those VMs need: flavors, other hosts' names and hypervisors, images, claims
on devices), whatever the number of hosts in it: a fleet starting together is served in
a few statements per few hundred hosts, not a transaction per host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.errors import ValidationError
from loadmaster.images import disk_bytes
from loadmaster.quota import Quota, flavor_quota
from loadmaster.resources.requirements import VNIC_SPEC
from loadmaster.resources.tree_fit import NODE_CLASSES
from loadmaster.store.chunks import in_chunks
from loadmaster.store.schema import (
    AllocationRow,
    FlavorRow,
    HostAgentRow,
    HostRow,
    ImageRow,
    ResourceClassRow,
    VmRow,
)

# The states of a VM that put it on a host's work list.
LISTED_STATES = ("pending", "running", "migrating")


@dataclass(frozen=True)
class WorkItem:
    """One VM the ledger puts on the host.

    ``launch``: pending here, start it. ``run``: it runs here, keep it (and its tags).
    ``migrate_out``: it runs here and must move to ``target_uri``. ``migrate_in``: it is on
    its way here; the source's agent moves it."""

    vm: str
    name: str
    action: str
    memory_mb: int
    vcpus: int
    tags: tuple[str, ...]
    resources: Mapping[str, int]
    target_host: str | None = None
    target_uri: str | None = None
    # A launch's claim on the host's child providers (its devices among them), by provider.
    providers: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # Its disk ({"image", "size_bytes"}; None: no disk) and NICs ([{"network", "mac"}]).
    disk: Mapping[str, object] | None = None
    nics: tuple[Mapping[str, str], ...] = ()
    # Its flavor's quota extra specs (``loadmaster.quota``).
    quota: Quota = field(default_factory=Quota)

    def to_dict(self) -> dict[str, object]:
        return {
            "providers": {p: dict(amounts) for p, amounts in self.providers.items()},
            "vm": self.vm,
            "name": self.name,
            "action": self.action,
            "memory_mb": self.memory_mb,
            "vcpus": self.vcpus,
            "tags": list(self.tags),
            "resources": dict(self.resources),
            "target_host": self.target_host,
            "target_uri": self.target_uri,
            "disk": dict(self.disk) if self.disk is not None else None,
            "nics": [dict(n) for n in self.nics],
            "quota": self.quota.to_dict(),
        }


@dataclass(frozen=True)
class WorkList:
    """Everything the ledger puts on ``host`` as of its ``generation``, read in one
    snapshot: an agent that read generation G knows of every claim stamped G or before."""

    host: str
    generation: int
    state: str
    items: tuple[WorkItem, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "generation": self.generation,
            "state": self.state,
            "items": [i.to_dict() for i in self.items],
        }


def read_work_lists(session: Session, host_ids: Sequence[int]) -> dict[int, WorkList]:
    """The work lists of the root hosts ``host_ids`` (those that exist), by host id, all
    read in ``session``'s snapshot."""
    roots = {
        row.id: row
        for chunk in in_chunks(sorted(set(host_ids)))
        for row in session.execute(
            select(HostRow.id, HostRow.name, HostRow.generation, HostRow.state).where(
                HostRow.id.in_(chunk)
            )
        )
    }
    rows: dict[int, VmRow] = {}
    for chunk in in_chunks(sorted(roots)):
        for vm in session.scalars(
            select(VmRow).where(
                or_(VmRow.host_id.in_(chunk), VmRow.target_host_id.in_(chunk)),
                VmRow.state.in_(LISTED_STATES),
            )
        ):
            rows[vm.id] = vm
    listed = [rows[i] for i in sorted(rows)]
    per_host: dict[int, list[VmRow]] = {}
    for vm in listed:
        for host_id in {vm.host_id, vm.target_host_id}:
            if host_id is not None and host_id in roots:
                per_host.setdefault(host_id, []).append(vm)
    context = _Context(session, listed, sorted(roots)) if listed else None
    return {
        host_id: WorkList(
            root.name,
            root.generation,
            root.state,
            tuple(context.item(vm, host_id) for vm in per_host.get(host_id, ()))
            if context is not None
            else (),
        )
        for host_id, root in roots.items()
    }


class _Context:
    """What the items of the VMs ``rows`` need beyond their own rows, read once for all."""

    def __init__(self, session: Session, rows: Sequence[VmRow], roots: Sequence[int]) -> None:
        flavor_ids = {r.flavor_id for r in rows if r.flavor_id is not None}
        self.flavors = {
            f.id: f
            for chunk in in_chunks(sorted(flavor_ids))
            for f in session.scalars(select(FlavorRow).where(FlavorRow.id.in_(chunk)))
        }
        others = sorted(
            {r.target_host_id for r in rows if r.target_host_id}
            | {r.host_id for r in rows if r.host_id}
        )
        self.names: dict[int, str] = {}
        self.uris: dict[int, str] = {}
        for chunk in in_chunks(others):
            self.names.update(
                session.execute(select(HostRow.id, HostRow.name).where(HostRow.id.in_(chunk))).all()
            )
            self.uris.update(
                session.execute(
                    select(HostAgentRow.host_id, HostAgentRow.hypervisor_uri).where(
                        HostAgentRow.host_id.in_(chunk)
                    )
                ).all()
            )
        images = sorted({r.image for r in rows if r.image})
        self.image_bytes: dict[str, int] = {}
        for names in in_chunks(images):
            self.image_bytes.update(
                session.execute(
                    select(ImageRow.name, ImageRow.size_bytes).where(ImageRow.name.in_(names))
                ).all()
            )
        self.quotas = {i: _quota(f.extra_specs) for i, f in self.flavors.items()}
        self.on_children = _on_children(
            session,
            roots,
            sorted(
                {
                    r.consumer_id
                    for r in rows
                    if r.state == "pending"
                    or (
                        r.flavor_id in self.flavors
                        and _may_hold_devices({*self.flavors[r.flavor_id].resources, *r.overrides})
                    )
                }
            ),
        )

    def item(self, r: VmRow, host_id: int) -> WorkItem:
        # A placed VM keeps its flavor (a flavor in use cannot be deleted).
        flavor = self.flavors.get(r.flavor_id) if r.flavor_id is not None else None
        resources = lookup.effective_resources(flavor.resources if flavor else {}, r.overrides)
        if r.state == "pending":
            action = "launch"
        elif r.state == "running":
            action = "run"
        elif r.host_id == host_id:
            action = "migrate_out"
        else:
            action = "migrate_in"
        return WorkItem(
            vm=r.uuid,
            name=r.name,
            action=action,
            memory_mb=int(resources.get("MEMORY_MB", 0)),
            vcpus=int(resources.get("VCPU", 0)),
            tags=tuple(r.tags),
            resources=resources,
            target_host=self.names.get(r.target_host_id) if r.target_host_id else None,
            target_uri=self.uris.get(r.target_host_id) if r.target_host_id else None,
            providers={}
            if action == "migrate_out"
            else self.on_children.get((r.consumer_id, host_id), {}),
            disk=_disk(r.image, resources, self.image_bytes),
            nics=_nics(r.nics, flavor.extra_specs if flavor else {}),
            quota=self.quotas[flavor.id] if flavor else Quota(),
        )


def _on_children(
    session: Session, roots: Sequence[int], consumers: Sequence[int]
) -> dict[tuple[int, int], dict[str, dict[str, int]]]:
    """Per (consumer, root host), its records on the root's child providers: what the
    agent must give a launching VM of its devices."""
    out: dict[tuple[int, int], dict[str, dict[str, int]]] = {}
    if not consumers:
        return out
    for root_chunk in in_chunks(roots):
        for chunk in in_chunks(consumers):
            for consumer, root, provider, class_name, amount in session.execute(
                select(
                    AllocationRow.consumer_id,
                    HostRow.root_id,
                    HostRow.name,
                    ResourceClassRow.name,
                    AllocationRow.amount,
                )
                .join(HostRow, HostRow.id == AllocationRow.host_id)
                .join(ResourceClassRow, ResourceClassRow.id == AllocationRow.resource_class_id)
                .where(
                    HostRow.root_id.in_(root_chunk),
                    HostRow.parent_id.is_not(None),
                    AllocationRow.consumer_id.in_(chunk),
                )
            ):
                out.setdefault((consumer, root or 0), {}).setdefault(provider, {})[class_name] = (
                    int(amount)
                )
    return out


def _disk(
    image: str | None, resources: Mapping[str, int], image_bytes: Mapping[str, int]
) -> dict[str, object] | None:
    size = disk_bytes(resources.get("DISK_GB"), image_bytes.get(image) if image else None)
    return {"image": image, "size_bytes": size} if size else None


def _nics(
    nics: Sequence[Mapping[str, str]] | None, extra_specs: Mapping[str, str]
) -> tuple[Mapping[str, str], ...]:
    """The VM's NICs for its agent; ``vnic_type`` ``direct`` when each is to be one of the
    VM's VFs (its flavor's ``lm:vnic_type``)."""
    if extra_specs.get(VNIC_SPEC) == "direct":
        return tuple({**n, "vnic_type": "direct"} for n in nics or ())
    return tuple(dict(n) for n in nics or ())


def _may_hold_devices(classes: Iterable[str]) -> bool:
    """Whether a VM asking ``classes`` may hold devices on the host's children: its
    agent gives a VM that arrived by migration devices under the providers claimed here."""
    return any(name not in NODE_CLASSES and name != "DISK_GB" for name in classes)


def _quota(extra_specs: Mapping[str, str]) -> Quota:
    try:
        return flavor_quota(extra_specs)
    except ValidationError:
        # A flavor made before its quota specs were understood, kept then with a warning
        # that they are not applied: they still are not, and its VMs still run.
        return Quota()
