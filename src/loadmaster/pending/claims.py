"""Claims: a VM's pending records written on a host's provider tree, in one transaction
with every check that decides whether they may be (capacity with pending counted, unit
rules, the VM's state, server-group rules, the host generation's compare-and-swap).

The hot path of every placement: it reads and writes with Core statements on the
session's connection, VMs, flavors and providers as plain records (``cluster/vm_rows.py``,
``trees.ProviderRow``), never ORM entities, and records the VMs' events itself
(``history.note_written``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import bindparam, delete, func, insert, select
from sqlalchemy.orm import Session, aliased
from sqlalchemy.orm.util import identity_key

from loadmaster.cluster import lookup
from loadmaster.cluster.records import AllocationRecord
from loadmaster.cluster.vm_rows import FlavorRules, VmState, vms_with_flavors, write_vms
from loadmaster.cluster.vms import move
from loadmaster.errors import (
    ConcurrentUpdate,
    Conflict,
    InsufficientCapacity,
    InvalidTransition,
    LoadmasterError,
    NotFound,
    ValidationError,
)
from loadmaster.pending.group_rules import GroupRules
from loadmaster.pending.trees import (
    PROVIDER_COLUMNS,
    ProviderRow,
    ProviderTree,
    load_trees,
    provider_rows,
    with_roots,
)
from loadmaster.resources import one_numa_node, pci_numa_affinity
from loadmaster.resources.tree_fit import fit_in_tree
from loadmaster.store import Prepared, pipelined, run, run_many
from loadmaster.store.chunks import in_chunks
from loadmaster.store.history import note_written
from loadmaster.store.locking import (
    bump_consumers,
    bump_generations,
    execute_core,
    now,
)
from loadmaster.store.schema import AllocationRow, HostRow, ResourceClassRow, VmRow
from loadmaster.store.transaction import Transaction


@dataclass(frozen=True)
class Claim:
    """Put ``vm`` on ``host``. With ``expected_generation`` the claim only lands if the host
    is still as the caller saw it (a scheduler's snapshot); without, the ledger re-reads and
    retries by itself on a race, as Placement does. ``move``: a VM that is only pending
    (claimed, not started) may be re-placed: its pending records elsewhere go in the same
    transaction (a drain), so it is never on no host nor on two."""

    vm: str
    host: str
    expected_generation: int | None = None
    move: bool = False
    # What the caller means: "start" (a requested or stopped VM), "migrate" (a running VM
    # moves), "evacuate" (a VM running or pending on a host that is down starts here, its
    # records there ending in the same transaction), or None (whichever the VM's state
    # makes it). Checked under the VM's row lock, so a VM that started, stopped or was
    # evacuated meanwhile is refused, not silently moved.
    intent: str | None = None


CLAIM_INTENTS = (None, "start", "migrate", "evacuate")


@dataclass(frozen=True)
class ClaimOutcome:
    vm: str
    host: str
    allocations: tuple[AllocationRecord, ...] = ()
    error: LoadmasterError | None = None
    # The cluster clock value the claim's hosts carry after its commit: a scheduler that
    # applied the claim to its snapshot need not read those hosts again for it.
    clock: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def claim(
    session: Transaction, claims: Sequence[Claim], all_or_nothing: bool
) -> list[ClaimOutcome]:
    """Write the claims in the caller's transaction, each seeing the ones before it.

    ``all_or_nothing``: the first failure raises (the caller rolls back: a gang).
    Otherwise every claim gets its own outcome and the good ones land together.
    """
    many = len(claims) > 1
    prefix = [f"claims[{i}]." if many else "" for i in range(len(claims))]
    claims = [_canonical(c) for c in claims]
    vms, flavors = vms_with_flavors(session, {c.vm for c in claims}, lock=True)
    groups = GroupRules.lock(session, {v.group_id for v in vms.values() if v.group_id is not None})
    groups.evacuating = _on_down_hosts(
        session, [vms[c.vm] for c in claims if c.intent == "evacuate" and c.vm in vms]
    )
    # Pending VMs this batch re-places, and VMs it evacuates: until their own claim, where
    # they are now does not bind their affinity siblings (they follow); ``split_groups``
    # checks the end.
    moving = {
        vms[c.vm].id for c in claims if c.move and c.vm in vms and vms[c.vm].state == "pending"
    } | groups.evacuating
    watched = {v.group_id for v in vms.values() if v.id in moving} - set(groups.split_groups())
    hosts, providers = _hosts_by_ident(session, {c.host for c in claims})
    trees = load_trees(
        session, {h.root_id or h.id for h in hosts.values()}, providers, sharing=True
    )
    # Only a class some tree has inventory of can be planned on it.
    class_ids = {name: id_ for tree in trees.values() for name, id_ in tree.class_ids.items()}
    class_names = {v: k for k, v in class_ids.items()}
    outcomes: list[ClaimOutcome] = []
    moved_from: set[int] = set()
    new_rows: list[dict[str, object]] = []
    touched: dict[int, int] = {}
    seen_vms: set[str] = set()
    stamp = now()
    for i, claim in enumerate(claims):
        discounted: list[tuple[int, int, str, str, int]] = []
        try:
            vm = vms.get(claim.vm)
            if vm is None:
                raise NotFound(f"{prefix[i]}vm {claim.vm!r}: no such VM", field=f"{prefix[i]}vm")
            host = hosts.get(claim.host)
            if host is None:
                raise NotFound(
                    f"{prefix[i]}host {claim.host!r}: no such host", field=f"{prefix[i]}host"
                )
            if claim.vm in seen_vms:
                raise ValidationError(
                    f"{prefix[i]}vm {claim.vm} is claimed twice in one batch",
                    field=f"{prefix[i]}vm",
                )
            tree = trees.get(host.root_id or host.id)
            flavor = flavors.get(vm.flavor_id) if vm.flavor_id is not None else None
            if tree is None:
                # Deleted between our two reads (READ COMMITTED): it is gone now.
                raise NotFound(
                    f"{prefix[i]}host {claim.host!r}: deleted meanwhile",
                    field=f"{prefix[i]}host",
                )
            if flavor is None:
                raise InvalidTransition(
                    f"{prefix[i]}vm {vm.uuid} is {vm.state} and its flavor is gone",
                    field=f"{prefix[i]}vm",
                )
            if claim.intent == "evacuate" and vm.id not in groups.evacuating:
                raise InvalidTransition(
                    f"{prefix[i]}vm {vm.uuid} is {vm.state} and not on a host that is down; "
                    "there is nothing to evacuate",
                    field=f"{prefix[i]}vm",
                )
            kept: set[str] = set()
            if vm.id in groups.evacuating or (claim.move and vm.state == "pending"):
                # Its records go in this transaction: what it holds on the pool is room.
                discounted = _on_sharing(session, vm, tree)
                _discount(tree, discounted, -1)
            elif vm.state == "running":
                kept = _kept_on_sharing(session, vm, tree)
            planned = _plan(vm, host, tree, flavor, class_ids, claim, prefix[i], kept)
            groups.check(vm, tree.root, prefix[i], moving=moving)
        except LoadmasterError as exc:
            if all_or_nothing:
                raise
            if discounted and tree is not None:
                _discount(tree, discounted, 1)  # its records stay after all
            outcomes.append(ClaimOutcome(claim.vm, claim.host, error=exc))
            continue
        seen_vms.add(claim.vm)
        groups.add(vm, tree.root)
        moving.discard(vm.id)
        records = []
        for provider, class_id, amount in planned:
            tree.used.setdefault((provider.id, class_id), {"active": 0, "pending": 0})[
                "pending"
            ] += amount
            touched.setdefault(provider.id, provider.generation)
            new_rows.append(
                {
                    "consumer_id": vm.consumer_id,
                    "host_id": provider.id,
                    "resource_class_id": class_id,
                    "amount": amount,
                    "state": "pending",
                    "created_at": stamp,
                }
            )
            records.append(
                AllocationRecord(vm.uuid, provider.name, class_names[class_id], amount, "pending")
            )
        touched.setdefault(tree.root.id, tree.root.generation)
        if vm.id in groups.evacuating:
            # Its host is down: its records there end with this claim, so the VM is never
            # on no host nor running on two.
            moved_from.update(_drop_pending(session, vm))
            if vm.state == "running":
                move(vm, "stopped")
                move(vm, "pending")
            else:
                vm.generation += 1
                vm.updated_at = stamp
            vm.host_id = tree.root.id
            vm.host_seq = _generation_after(tree, touched)
        elif vm.state == "running":
            # The source's work changes too (run -> migrate_out): its agent must hear.
            if vm.host_id is not None:
                moved_from.add(vm.host_id)
            vm.target_host_id = tree.root.id
            move(vm, "migrating")
        elif vm.state == "pending":
            moved_from.update(_drop_pending(session, vm))
            vm.host_id = tree.root.id
            vm.generation += 1
            vm.updated_at = stamp
            vm.host_seq = _generation_after(tree, touched)
        else:
            vm.host_id = tree.root.id
            move(vm, "pending")
            vm.host_seq = _generation_after(tree, touched)
        outcomes.append(ClaimOutcome(vm.uuid, host.name, tuple(records)))
    split = groups.split_groups(watched)
    if split:
        # A re-placed member's sibling did not land (the host filled meanwhile): the
        # group would be split at commit. A race: the caller decides again.
        raise ConcurrentUpdate(
            f"affinity group {groups.groups[split[0]].name} would be split by this batch; retry",
            field="host",
        )
    consumers = {vms[o.vm].consumer_id for o in outcomes if o.ok}
    # The writes, the swaps and the clock in one round trip on PostgreSQL.
    with pipelined(session) as send:
        if new_rows:
            run_many(session, _INSERT_RECORDS, new_rows)
        _write_back(session, [vms[o.vm] for o in outcomes if o.ok], providers)
        # The hosts re-placed VMs left, and the sources of migrations, are bumped too (no
        # compare-and-swap: nothing was added there), locked in one id order with the
        # others; the consumers after the hosts, the clock last (``store/locking.py``).
        clock = bump_generations(
            session,
            touched,
            touch=moved_from,
            before_clock=lambda: bump_consumers(session, consumers),
            sent=send,
        )
    return [replace(o, clock=clock) if o.ok else o for o in outcomes]


def _canonical(claim: Claim) -> Claim:
    uuid = lookup.canonical_uuid(claim.vm)
    return claim if uuid == claim.vm else replace(claim, vm=uuid)


def _write_back(session: Transaction, claimed: list[VmState], providers: list[ProviderRow]) -> None:
    """The claimed VMs' rows and their events. An entity of one of them the session had
    loaded before (a Placement write of a VM's allocations) is expired, so that nothing
    reads its old values or writes them back."""
    write_vms(session, claimed)
    note_written(
        session,
        [(vm, vm.before) for vm in claimed],
        {p.id: p.name for p in providers},
    )
    if not isinstance(session, Session):  # a Core transaction: no entity to expire
        return
    for vm in claimed:
        loaded = session.identity_map.get(identity_key(VmRow, vm.id))
        if loaded is not None:
            session.expire(loaded)


def _generation_after(tree: ProviderTree, touched: Mapping[int, int]) -> int:
    """The root's generation once the claim commits: the compare-and-swap moves it exactly
    one past what was read (or the claim fails and nothing is written). Set with the VM's
    other changes, so its row is written once."""
    return touched[tree.root.id] + 1


def _plan(
    vm: VmState,
    host: ProviderRow,
    tree: ProviderTree,
    flavor: FlavorRules,
    class_ids: Mapping[str, int],
    claim: Claim,
    prefix: str,
    kept: set[str],
) -> list[tuple[ProviderRow, int, int]]:
    """``kept``: classes a migrating VM holds on a sharing provider the destination
    reaches too: the allocation there stays, and is not claimed again."""
    if host.parent_id is not None:
        raise ValidationError(
            f"{prefix}host {host.name} is a child provider; claim on its root host",
            field=f"{prefix}host",
        )
    if claim.expected_generation is not None and host.generation != claim.expected_generation:
        raise ConcurrentUpdate(
            f"{prefix}host {host.name} changed since it was read (generation {host.generation}, "
            f"expected {claim.expected_generation})",
            field=f"{prefix}host",
        )
    if host.state != "up":
        raise Conflict(f"{prefix}host {host.name} is {host.state}, not up", field=f"{prefix}host")
    movable = ("requested", "stopped", "running") + (("pending",) if claim.move else ())
    if vm.state not in movable:
        raise InvalidTransition(
            f"{prefix}vm {vm.uuid} is {vm.state}; it already holds a claim", field=f"{prefix}vm"
        )
    if claim.intent == "start" and vm.state == "running":
        raise InvalidTransition(
            f"{prefix}vm {vm.uuid} is already running on its host; to move it, migrate it",
            field=f"{prefix}vm",
        )
    if claim.intent == "migrate" and vm.state != "running":
        raise InvalidTransition(
            f"{prefix}vm {vm.uuid} is {vm.state}; only a running VM migrates",
            field=f"{prefix}vm",
        )
    if vm.state in ("running", "pending") and vm.host_id == host.id:
        where = "runs" if vm.state == "running" else "is pending"
        raise ValidationError(
            f"{prefix}vm {vm.uuid} already {where} on {host.name}", field=f"{prefix}host"
        )
    # The flavor's traits bind every claim, not only the scheduler's choices: a host named
    # by hand (``vm migrate --host``, a Placement write) must have them too.
    lacking = sorted(set(flavor.required_traits) - tree.traits)
    if lacking:
        raise Conflict(
            f"{prefix}host {host.name} lacks trait {', '.join(lacking)} that flavor "
            f"{flavor.name} requires",
            field=f"{prefix}host",
        )
    refused = sorted(set(flavor.forbidden_traits) & tree.traits)
    if refused:
        raise Conflict(
            f"{prefix}host {host.name} has trait {', '.join(refused)} that flavor "
            f"{flavor.name} forbids",
            field=f"{prefix}host",
        )
    wanted = {
        name: amount
        for name, amount in lookup.effective_resources(flavor.resources, vm.overrides).items()
        if name not in kept
    }
    if not wanted:
        # No records would be written: nothing could ever end such a claim.
        raise ValidationError(
            f"{prefix}vm {vm.uuid} asks for no resource at all (its overrides zero "
            f"every class of flavor {flavor.name})",
            field=f"{prefix}vm",
        )
    affinity = pci_numa_affinity(flavor.extra_specs)
    fit = fit_in_tree(
        tree.providers,
        wanted,
        one_node=one_numa_node(flavor.extra_specs) or affinity is not None,
        offers=lambda p, name: (
            name in class_ids
            and (p.id, class_ids[name]) in tree.inventories
            and (
                not flavor.class_traits
                or set(flavor.class_traits.get(name, ())) <= tree.provider_traits.get(p.id, set())
            )
        ),
        problem=lambda p, name, amount: tree.problem(p, name, class_ids[name], amount),
        node_of=tree.numa_nodes(),
        affinity=affinity,
    )
    misfit = fit.misfit
    if misfit is None:
        return [(provider, class_ids[name], amount) for provider, name, amount in fit.plan]
    if misfit.resource_class is None:
        why = f"hw:pci_numa_affinity_policy={affinity}" if affinity else "hw:numa_nodes=1"
        raise InsufficientCapacity(
            f"{prefix}host {host.name} cannot fit VM {vm.uuid} on one NUMA node "
            f"({why}): {'; '.join(misfit.problems)}",
            field=f"{prefix}resources",
        )
    where = f"{prefix}resources.{misfit.resource_class}"
    if misfit.missing:
        raise InsufficientCapacity(
            f"host {host.name} has no {misfit.resource_class} inventory", field=where
        )
    raise InsufficientCapacity(
        f"{prefix}host {host.name} cannot fit VM {vm.uuid}: {misfit.problems[0]}", field=where
    )


def _on_sharing(
    session: Transaction, vm: VmState, tree: ProviderTree
) -> list[tuple[int, int, str, str, int]]:
    """The VM's records on sharing providers ``tree`` reaches (a disk on the storage its
    hosts mount): (provider id, class id, class, state, amount) each."""
    sharing = {p.id for p in tree.providers if (p.root_id or p.id) != tree.root.id}
    if not sharing:
        return []
    rows = execute_core(
        session,
        select(
            AllocationRow.host_id,
            AllocationRow.resource_class_id,
            ResourceClassRow.name,
            AllocationRow.state,
            AllocationRow.amount,
        )
        .join(ResourceClassRow, ResourceClassRow.id == AllocationRow.resource_class_id)
        .where(AllocationRow.consumer_id == vm.consumer_id, AllocationRow.host_id.in_(sharing)),
    )
    return [tuple(r) for r in rows]


def _kept_on_sharing(session: Transaction, vm: VmState, tree: ProviderTree) -> set[str]:
    """The classes a running VM holds on sharing providers ``tree`` reaches: a migration
    there moves none of it."""
    return {name for _, _, name, _, _ in _on_sharing(session, vm, tree)}


def _discount(tree: ProviderTree, records: list[tuple[int, int, str, str, int]], sign: int) -> None:
    """Count a VM's records on sharing providers (``_on_sharing``) as free (``sign``
    -1) while its claim is planned: they end with it (an evacuation, a re-placed pending
    VM), so the disk it holds on a pool does not need room twice; +1 puts them back."""
    for provider, class_id, _, state, amount in records:
        tree.used[(provider, class_id)][state] += sign * amount


def _hosts_by_ident(
    session: Transaction, idents: set[str]
) -> tuple[dict[str, ProviderRow], list[ProviderRow]]:
    """The hosts by each ident given (a name, or a uuid in any case), and every provider
    of their trees (in id order): read in one statement, so a host is never without its
    tree."""
    found: dict[str, ProviderRow] = {}
    providers: dict[int, ProviderRow] = {}
    for chunk in in_chunks(sorted(idents)):
        uuids = [lookup.canonical_uuid(i) for i in chunk]
        rows = run(session, _TREES_OF_HOSTS, {"uuids": uuids, "names": chunk})
        for row in provider_rows(rows):
            providers[row.id] = row
    wanted = set(idents) | {lookup.canonical_uuid(i) for i in idents}
    for row in providers.values():
        for key in (row.uuid, row.name):
            if key in wanted:
                found[key] = row
    for ident in idents:
        if ident not in found and lookup.canonical_uuid(ident) in found:
            found[ident] = found[lookup.canonical_uuid(ident)]
    return found, [providers[i] for i in sorted(providers)]


_INSERT_RECORDS = Prepared(insert(AllocationRow.metadata.tables["allocations"]))
_NAMED = aliased(HostRow)
_TREES_OF_HOSTS = Prepared(
    select(*PROVIDER_COLUMNS)
    .where(
        HostRow.root_id.in_(
            select(func.coalesce(_NAMED.root_id, _NAMED.id)).where(
                _NAMED.uuid.in_(bindparam("uuids", expanding=True))
                | _NAMED.name.in_(bindparam("names", expanding=True))
            )
        )
    )
    .order_by(HostRow.id)
    # Locked as read (FOR NO KEY UPDATE, in id order; SQLite has no row locks): a writer
    # that bumped a generation between this read and the compare-and-swap made the claim
    # lose and retry, and host agents reporting every fraction of a second on a few hosts
    # made a batch lose all its retries.
    .with_for_update(key_share=True, of=HostRow)
)


def _on_down_hosts(session: Transaction, vms: Sequence[VmState]) -> set[int]:
    """Ids of ``vms`` running or pending (not migrating) on a root host that is down."""
    hosts = {v.host_id for v in vms if v.state in ("running", "pending") and v.host_id}
    if not hosts:
        return set()
    down = set(
        execute_core(
            session, select(HostRow.id).where(HostRow.id.in_(hosts), HostRow.state == "down")
        ).scalars()
    )
    return {v.id for v in vms if v.state in ("running", "pending") and v.host_id in down}


def _drop_pending(session: Transaction, vm: VmState) -> set[int]:
    """Delete a re-placed VM's records (pending, or on a host that is down); the providers
    they were on."""
    mine = AllocationRow.consumer_id == vm.consumer_id
    hosts = set(execute_core(session, select(AllocationRow.host_id).where(mine)).scalars())
    execute_core(session, delete(AllocationRow).where(mine))
    return with_roots(session, hosts)
