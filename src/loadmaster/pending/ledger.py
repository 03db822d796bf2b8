"""The allocation ledger: pending and active records, claimed, activated and released.

One record per (VM, provider, class). Totals are never stored: every capacity check sums
the records inside the claiming transaction, and every change bumps the host's
generation with a compare-and-swap, so two processes claiming on one host can never
both win (the loser re-reads and retries, or is told why not).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.cluster.hosts import bump_generations, now, touch_generations
from loadmaster.cluster.records import AllocationRecord, ClassUsage, VmRecord
from loadmaster.cluster.vms import TRANSITIONS, move, vm_records
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
from loadmaster.resources import Inventory, one_numa_node
from loadmaster.store import Store
from loadmaster.store.chunks import in_chunks
from loadmaster.store.schema import AllocationRow, FlavorRow, HostRow, InventoryRow, VmRow

DEFAULT_CONFLICT_RETRIES = 10


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
    # moves), or None (whichever the VM's state makes it). Checked under the VM's row lock,
    # so a VM that started or stopped meanwhile is refused, not silently migrated.
    intent: str | None = None


CLAIM_INTENTS = (None, "start", "migrate")


@dataclass(frozen=True)
class ClaimOutcome:
    vm: str
    host: str
    allocations: tuple[AllocationRecord, ...] = ()
    error: LoadmasterError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class ReconcileResult:
    activated: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()


@dataclass(frozen=True)
class FailOutcome:
    """``kind``: ``launch`` or ``migration`` when a claim ended, ``None`` when there was
    nothing left to undo."""

    vm: VmRecord
    kind: str | None


@dataclass
class _Tree:
    """One root host and its child providers, as read inside the claiming transaction."""

    root: HostRow
    providers: list[HostRow]
    inventories: dict[tuple[int, int], Inventory] = field(default_factory=dict)
    used: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)


class Ledger:
    def __init__(self, store: Store, *, conflict_retries: int = DEFAULT_CONFLICT_RETRIES) -> None:
        self._store = store
        self._retries = conflict_retries

    # -- claiming ----------------------------------------------------------------------
    def claim(
        self,
        vm: str,
        host: str,
        *,
        expected_generation: int | None = None,
        intent: str | None = None,
    ) -> list[AllocationRecord]:
        outcome = self.claim_many([Claim(vm, host, expected_generation, intent=intent)])[0]
        return list(outcome.allocations)

    def claim_many(
        self, claims: Sequence[Claim], *, all_or_nothing: bool = True
    ) -> list[ClaimOutcome]:
        """Claim many VMs in one transaction, each seeing the claims before it.

        ``all_or_nothing``: the first failure raises and nothing is written (a gang).
        Otherwise every claim gets its own outcome and the good ones land together.
        """
        if not claims:
            return []
        for i, c in enumerate(claims):
            if c.intent not in CLAIM_INTENTS:
                raise ValidationError(
                    f"claims[{i}].intent must be start or migrate, got {c.intent!r}",
                    field=f"claims[{i}].intent",
                )
        # A claim pinned to the generation its caller read cannot succeed on a re-read: the
        # host has moved on. Retrying is worth it only if some claim could still land.
        pinned = [c.expected_generation is not None for c in claims]
        futile = any(pinned) if all_or_nothing else all(pinned)
        retries = 0 if futile else self._retries
        for attempt in range(retries + 1):
            try:
                with self._store.write() as session:
                    return self._claim(session, claims, all_or_nothing)
            except ConcurrentUpdate:
                if attempt == retries:
                    raise
        raise AssertionError("unreachable")

    def _claim(
        self, session: Session, claims: Sequence[Claim], all_or_nothing: bool
    ) -> list[ClaimOutcome]:
        many = len(claims) > 1
        prefix = [f"claims[{i}]." if many else "" for i in range(len(claims))]
        claims = [replace(c, vm=lookup.canonical_uuid(c.vm)) for c in claims]
        vms = _lock_vms(session, {c.vm for c in claims})
        groups = GroupRules.lock(
            session, {v.group_id for v in vms.values() if v.group_id is not None}
        )
        # Pending VMs this batch re-places: until their own claim, where they are now does
        # not bind their affinity siblings (they follow); ``split_groups`` checks the end.
        moving = {
            vms[c.vm].id for c in claims if c.move and c.vm in vms and vms[c.vm].state == "pending"
        }
        watched = {v.group_id for v in vms.values() if v.id in moving} - set(groups.split_groups())
        hosts = _hosts_by_ident(session, {c.host for c in claims})
        trees = _load_trees(session, {h.root_id or h.id for h in hosts.values()})
        flavors = {
            f.id: f
            for f in session.scalars(
                select(FlavorRow).where(FlavorRow.id.in_({v.flavor_id for v in vms.values()}))
            )
        }
        class_ids = lookup.class_ids(session)
        class_names = {v: k for k, v in class_ids.items()}
        outcomes: list[ClaimOutcome] = []
        moved_from: set[int] = set()
        new_rows: list[dict[str, object]] = []
        touched: dict[int, int] = {}
        launches: list[tuple[VmRow, int]] = []
        seen_vms: set[str] = set()
        stamp = now()
        for i, claim in enumerate(claims):
            try:
                vm = vms.get(claim.vm)
                if vm is None:
                    raise NotFound(
                        f"{prefix[i]}vm {claim.vm!r}: no such VM", field=f"{prefix[i]}vm"
                    )
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
                planned = self._plan(vm, host, tree, flavor, class_ids, claim, prefix[i])
                groups.check(vm, tree.root, prefix[i], moving=moving)
            except LoadmasterError as exc:
                if all_or_nothing:
                    raise
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
                        "vm_id": vm.id,
                        "host_id": provider.id,
                        "resource_class_id": class_id,
                        "amount": amount,
                        "state": "pending",
                        "created_at": stamp,
                    }
                )
                records.append(
                    AllocationRecord(
                        vm.uuid, provider.name, class_names[class_id], amount, "pending"
                    )
                )
            touched.setdefault(tree.root.id, tree.root.generation)
            if vm.state == "running":
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
                launches.append((vm, tree.root.id))
            else:
                vm.host_id = tree.root.id
                move(vm, "pending")
                launches.append((vm, tree.root.id))
            outcomes.append(ClaimOutcome(vm.uuid, host.name, tuple(records)))
        split = groups.split_groups(watched)
        if split:
            # A re-placed member's sibling did not land (the host filled meanwhile): the
            # group would be split at commit. A race: the caller decides again.
            raise ConcurrentUpdate(
                f"affinity group {groups.groups[split[0]].name} would be split by this "
                "batch; retry",
                field="host",
            )
        if new_rows:
            # One executemany; nothing reads these rows back as objects.
            session.execute(insert(AllocationRow), new_rows)
        session.flush()
        # The hosts re-placed VMs left, and the sources of migrations, are bumped too (no
        # compare-and-swap: nothing was added there), locked in one id order with the others.
        bump_generations(session, touched, touch=moved_from)
        for vm, root_id in launches:
            # The compare-and-swap moved the root exactly one past what was read.
            vm.host_seq = touched[root_id] + 1
        return outcomes

    def _plan(
        self,
        vm: VmRow,
        host: HostRow,
        tree: _Tree,
        flavor: FlavorRow,
        class_ids: Mapping[str, int],
        claim: Claim,
        prefix: str,
    ) -> list[tuple[HostRow, int, int]]:
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
            raise Conflict(
                f"{prefix}host {host.name} is {host.state}, not up", field=f"{prefix}host"
            )
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
        wanted = lookup.effective_resources(flavor.resources, vm.overrides)
        if not wanted:
            # No records would be written: nothing could ever end such a claim.
            raise ValidationError(
                f"{prefix}vm {vm.uuid} asks for no resource at all (its overrides zero "
                f"every class of flavor {flavor.name})",
                field=f"{prefix}vm",
            )
        plan: list[tuple[HostRow, int, int]] = []
        if one_numa_node(flavor.extra_specs):
            plan, wanted = self._plan_one_node(vm, host, tree, wanted, class_ids, prefix)
        for name, amount in sorted(wanted.items()):
            where = f"{prefix}resources.{name}"
            class_id = class_ids.get(name)
            offering = [
                p
                for p in tree.providers
                if class_id is not None and (p.id, class_id) in tree.inventories
            ]
            if not offering:
                raise InsufficientCapacity(f"host {host.name} has no {name} inventory", field=where)
            problem = ""
            for provider in offering:
                assert class_id is not None
                problem = _problem(tree, provider, name, class_id, amount)
                if not problem:
                    plan.append((provider, class_id, amount))
                    break
            else:
                raise InsufficientCapacity(
                    f"{prefix}host {host.name} cannot fit VM {vm.uuid}: {problem}", field=where
                )
        return plan

    def _plan_one_node(
        self,
        vm: VmRow,
        host: HostRow,
        tree: _Tree,
        wanted: Mapping[str, int],
        class_ids: Mapping[str, int],
        prefix: str,
    ) -> tuple[list[tuple[HostRow, int, int]], dict[str, int]]:
        """``hw:numa_nodes=1``: the classes the host's NUMA nodes (its children) offer all
        come from the first node with room for every one of them. Returns that part of
        the plan and the classes left to place as usual (those on the root only)."""
        nodes = tree.providers[1:]
        on_nodes = {
            name: amount
            for name, amount in wanted.items()
            if name in class_ids and any((n.id, class_ids[name]) in tree.inventories for n in nodes)
        }
        rest = {name: amount for name, amount in wanted.items() if name not in on_nodes}
        if not on_nodes:
            return [], rest
        problems = []
        for node in nodes:
            found = [
                _problem(tree, node, name, class_ids[name], amount)
                for name, amount in sorted(on_nodes.items())
            ]
            if not any(found):
                plan = [
                    (node, class_ids[name], amount) for name, amount in sorted(on_nodes.items())
                ]
                return plan, rest
            problems.append(next(p for p in found if p))
        raise InsufficientCapacity(
            f"{prefix}host {host.name} cannot fit VM {vm.uuid} on one NUMA node "
            f"(hw:numa_nodes=1): {'; '.join(problems)}",
            field=f"{prefix}resources",
        )

    # -- lifecycle ---------------------------------------------------------------------
    def activate(self, vm: str, host: str | None = None) -> VmRecord:
        """The VM reported up: its pending records become active (a migration completes).

        ``host``: where the VM now runs, as its agent says. The claim must be there: an
        agent that launched a VM whose claim has meanwhile moved elsewhere (a drain
        re-placed it) must not activate the claim on another host."""
        with self._store.write() as session:
            row = lookup.vm_row(session, vm, lock=True)
            claimed = row.target_host_id if row.state == "migrating" else row.host_id
            if host is not None:
                where = lookup.host_row(session, host)
                if (where.root_id or where.id) != claimed:
                    raise Conflict(
                        f"VM {vm} is {row.state} and not claimed on {where.name}; it cannot "
                        "come up there",
                        field="host",
                    )
            if row.state == "running":
                return vm_records(session, [row])[0]
            if row.state not in ("pending", "migrating"):
                raise InvalidTransition(
                    f"VM {vm} is {row.state}; only a pending or migrating VM can start", field="vm"
                )
            self._activate(session, row)
            return vm_records(session, [row])[0]

    def _activate(self, session: Session, row: VmRow) -> None:
        rows = list(session.scalars(select(AllocationRow).where(AllocationRow.vm_id == row.id)))
        touched = _with_roots(session, {r.host_id for r in rows})
        if row.state == "migrating":
            target_tree = _tree_ids(session, row.target_host_id)
            for r in rows:
                if r.host_id not in target_tree:
                    session.delete(r)
            row.host_id, row.target_host_id = row.target_host_id, None
        session.execute(
            update(AllocationRow)
            .where(AllocationRow.vm_id == row.id, AllocationRow.state == "pending")
            .values(state="active")
            .execution_options(synchronize_session=False)
        )
        move(row, "running")
        # The fault stays, as the last one the VM had (Nova keeps its instance faults too).
        row.tried_hosts = []
        session.flush()
        touch_generations(session, touched)
        row.host_seq = _generation(session, row.host_id)

    def release(self, vm: str, host: str | None = None) -> int:
        """Remove the VM's records (on ``host`` only, if given). Releasing again is a no-op.

        Returns how many records were removed. The VM's state follows: a pending VM goes back
        to requested, an aborted migration back to running, a running VM with nothing left
        to stopped.
        """
        with self._store.write() as session:
            row = lookup.vm_row(session, vm, lock=True)
            host_row = lookup.host_row(session, host) if host is not None else None
            return self._release(session, row, host_row)

    def _release(
        self, session: Session, row: VmRow, host_row: HostRow | None, *, then: str | None = None
    ) -> int:
        """``then``: the state once nothing is left (by default: requested again for a VM
        that never started, stopped for one that ran)."""
        query = select(AllocationRow).where(AllocationRow.vm_id == row.id)
        if host_row is not None:
            query = query.where(
                AllocationRow.host_id.in_(_tree_ids(session, host_row.root_id or host_row.id))
            )
        doomed = list(session.scalars(query))
        if not doomed:
            if host_row is None and row.state == "pending":
                # A pending VM holding no record at all (a VM whose overrides zeroed every
                # resource, from before such VMs were refused) is released all the same.
                move(row, then or "requested")
                row.host_id = row.target_host_id = None
            return 0
        left = list(
            session.scalars(
                select(AllocationRow).where(
                    AllocationRow.vm_id == row.id, AllocationRow.id.notin_([r.id for r in doomed])
                )
            )
        )
        if row.state == "migrating" and left and all(r.state == "pending" for r in left):
            raise InvalidTransition(
                f"VM {row.uuid} is migrating; finish (activate) or abort (release the destination) first",
                field="host",
            )
        touched = _with_roots(session, {r.host_id for r in doomed})
        if row.state == "migrating" and left and row.host_id is not None:
            # An aborted migration changes its source's work too (migrate_out -> run).
            touched.add(row.host_id)
        for r in doomed:
            session.delete(r)
        if not left:
            move(row, then or ("requested" if row.state == "pending" else "stopped"))
            row.host_id = row.target_host_id = row.host_seq = None
        elif row.state == "migrating":
            row.target_host_id = None
            move(row, "running")
        session.flush()
        touch_generations(session, touched)
        return len(doomed)

    def stop(self, vm: str, *, if_on: str | None = None) -> VmRecord:
        """``if_on``: only a VM still running or pending on that host (a drain's force: a
        VM that began to migrate or moved meanwhile is left alone, InvalidTransition)."""
        with self._store.write() as session:
            row = lookup.vm_row(session, vm, lock=True)
            if if_on is not None:
                host = lookup.host_row(session, if_on)
                if row.state not in ("running", "pending") or row.host_id != host.id:
                    raise InvalidTransition(
                        f"VM {vm} is no longer running or pending on {host.name}", field="vm"
                    )
            if row.state == "stopped":
                return vm_records(session, [row])[0]
            if "stopped" not in TRANSITIONS[row.state]:
                raise InvalidTransition(f"VM {vm} is {row.state} and cannot be stopped", field="vm")
            self._release(session, row, None, then="stopped")
            if row.state != "stopped":
                move(row, "stopped")
                row.host_id = row.target_host_id = None
            return vm_records(session, [row])[0]

    def delete(self, vm: str) -> VmRecord:
        with self._store.write() as session:
            row = lookup.vm_row(session, vm, lock=True)
            if row.state != "deleted":
                self._release(session, row, None)
                move(row, "deleted")
                row.host_id = row.target_host_id = None
            return vm_records(session, [row])[0]

    def reconcile(
        self,
        host: str,
        present: Iterable[str],
        *,
        as_of: datetime | None = None,
        seen_generation: int | None = None,
        launching: Iterable[str] = (),
    ) -> ReconcileResult:
        """Align the records with what the host reports running.

        A pending VM that is there has started (activate). A VM the report may speak for and
        that is neither there nor ``launching`` has ended: a pending one never started
        (release: it may be placed again), a running one has stopped. The report may speak
        for a VM only if the host listed its VMs after learning of it:

        - with ``seen_generation`` (the host generation of the last work list the host's
          agent read before listing its VMs): the VM's claim or activation there stamped the
          host at that generation or before (``host_seq``). No clock is compared, so a slow
          launch keeps its claim for as long as its agent says it is launching.
        - otherwise, by the server's clock, ``as_of`` (when the host listed its VMs): records
          newer than it, and VMs that came up since, are left alone.

        A migration in flight is left to whoever runs it (``activate`` completes it,
        releasing the destination aborts it): the destination lists the VM only once it has
        switched over, so a report cannot tell a migration still copying from one that
        failed. Nothing here runs on a timer.
        """
        seen = {lookup.canonical_uuid(u) for u in present}
        busy = {lookup.canonical_uuid(u) for u in launching}
        # By sequence the clock plays no part, so a host's skewed clock is no error.
        as_of = now() if seen_generation is not None else check_as_of(as_of)
        activated: list[str] = []
        released: list[str] = []
        stopped: list[str] = []

        def known(vm: VmRow, since: datetime) -> bool:
            if seen_generation is not None:
                # Every claim moves its host past generation 0; a VM claimed before
                # stamps existed counts as claimed at 1.
                return (vm.host_seq or 1) <= seen_generation
            return since <= as_of

        with self._store.write() as session:
            root = lookup.host_row(session, host)
            tree = _tree_ids(session, root.root_id or root.id)
            # Lock the VMs first, then read their records: an activation or a claim that
            # committed while we waited is seen, not overwritten with what it replaced.
            here = select(AllocationRow.vm_id).where(AllocationRow.host_id.in_(tree))
            vms = session.scalars(
                select(VmRow).where(VmRow.id.in_(here)).order_by(VmRow.id).with_for_update()
            ).all()
            lookup.share_groups(session, vms)
            by_vm: dict[int, tuple[VmRow, list[AllocationRow]]] = {v.id: (v, []) for v in vms}
            for alloc in session.scalars(
                select(AllocationRow).where(
                    AllocationRow.host_id.in_(tree), AllocationRow.vm_id.in_(by_vm)
                )
            ):
                by_vm[alloc.vm_id][1].append(alloc)
            for vm, allocs in by_vm.values():
                if not allocs or vm.state == "migrating":
                    continue  # left this host meanwhile, or a migration (its executor's)
                pending_here = [a for a in allocs if a.state == "pending"]
                if vm.uuid in seen:
                    if pending_here:
                        self._activate(session, vm)
                        activated.append(vm.uuid)
                elif vm.uuid in busy:
                    continue
                elif pending_here:
                    if known(vm, max(a.created_at for a in pending_here)):
                        self._release(session, vm, root)
                        vm.fault = f"host {root.name} reported it neither running nor launching"
                        released.append(vm.uuid)
                elif vm.state == "running" and known(vm, vm.updated_at):
                    # Only a VM already running here when the host listed its VMs is proven
                    # gone; one that came up (or finished migrating here) since is spared.
                    self._release(session, vm, root)
                    stopped.append(vm.uuid)
            unexpected = sorted(seen - {vm.uuid for vm, _ in by_vm.values()})
        return ReconcileResult(tuple(activated), tuple(released), tuple(stopped), tuple(unexpected))

    def fail(self, vm: str, host: str, reason: str) -> FailOutcome:
        """``host`` says it could not run ``vm``: a launch it refused or that failed, or a
        migration to or from it that failed. A launch gives the claim up (the VM is
        ``requested`` again, the host remembered in ``tried_hosts``); a migration rolls back
        (the destination's claim goes, the VM keeps running on the source). Either way the
        reason is kept on the VM. Saying it again, or about a claim that has already ended,
        changes nothing."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValidationError("reason must say why, in a non-empty string", field="reason")
        with self._store.write() as session:
            row = lookup.vm_row(session, vm, lock=True)
            host_row = lookup.host_row(session, host)
            root_id = host_row.root_id or host_row.id
            kind: str | None = None
            if row.state == "pending" and row.host_id == root_id:
                kind = "launch"
                self._release(session, row, host_row)
                row.tried_hosts = [*row.tried_hosts, host_row.name]
            elif row.state == "migrating" and root_id in (row.host_id, row.target_host_id):
                kind = "migration"
                target = session.get(HostRow, row.target_host_id)
                self._release(session, row, target)
            if kind is not None:
                row.fault = f"{kind} on {host_row.name} failed: {reason.strip()[:2000]}"
            return FailOutcome(vm_records(session, [row])[0], kind)

    # -- reading -----------------------------------------------------------------------
    def allocations(
        self, *, vm: str | None = None, host: str | None = None, state: str | None = None
    ) -> list[AllocationRecord]:
        with self._store.read() as session:
            query = (
                select(
                    VmRow.uuid,
                    HostRow.name,
                    AllocationRow.resource_class_id,
                    AllocationRow.amount,
                    AllocationRow.state,
                )
                .join(VmRow, VmRow.id == AllocationRow.vm_id)
                .join(HostRow, HostRow.id == AllocationRow.host_id)
                .order_by(AllocationRow.id)
            )
            if vm is not None:
                query = query.where(AllocationRow.vm_id == lookup.vm_row(session, vm).id)
            if host is not None:
                query = query.where(AllocationRow.host_id == lookup.host_row(session, host).id)
            if state is not None:
                if state not in ("pending", "active"):
                    raise ValidationError("state must be pending or active", field="state")
                query = query.where(AllocationRow.state == state)
            names = lookup.class_names(session)
            return [
                AllocationRecord(u, h, names[c], a, s) for u, h, c, a, s in session.execute(query)
            ]

    def usages(self, hosts: Iterable[str] | None = None) -> dict[str, dict[str, ClassUsage]]:
        """Per provider and class: capacity, active, pending — all summed from records now."""
        with self._store.read() as session:
            query = select(HostRow.id, HostRow.name)
            if hosts is not None:
                ids = [lookup.host_row(session, h).id for h in hosts]
                query = query.where(HostRow.id.in_(ids))
            names_by_id: dict[int, str] = dict(session.execute(query).all())
            class_names = lookup.class_names(session)
            sums = lookup.used_by_provider(session, names_by_id)
            result: dict[str, dict[str, ClassUsage]] = {name: {} for name in names_by_id.values()}
            inv_query = select(InventoryRow)
            if hosts is not None:
                inv_query = inv_query.where(InventoryRow.host_id.in_(names_by_id))
            for inv in session.scalars(inv_query):
                used = sums.get((inv.host_id, inv.resource_class_id), {})
                capacity = lookup.inventory_of(inv).capacity
                result[names_by_id[inv.host_id]][class_names[inv.resource_class_id]] = ClassUsage(
                    capacity, used.get("active", 0), used.get("pending", 0)
                )
            return result

    def pending_for_host(self, host: str) -> dict[str, int]:
        return _sum_by_class(self.allocations(host=host, state="pending"))

    def pending_for_vm(self, vm: str) -> dict[str, dict[str, int]]:
        per_host: dict[str, dict[str, int]] = defaultdict(dict)
        for a in self.allocations(vm=vm, state="pending"):
            per_host[a.host][a.resource_class] = (
                per_host[a.host].get(a.resource_class, 0) + a.amount
            )
        return dict(per_host)

    def project_usage(self, project_id: str) -> dict[str, dict[str, int]]:
        """Per class, active and pending totals of one project's VMs (for quota)."""
        with self._store.read() as session:
            names = lookup.class_names(session)
            rows = session.execute(
                select(AllocationRow.resource_class_id, AllocationRow.state, AllocationRow.amount)
                .join(VmRow, VmRow.id == AllocationRow.vm_id)
                .where(VmRow.project_id == project_id)
            )
            totals: dict[str, dict[str, int]] = {}
            for class_id, state, amount in rows:
                bucket = totals.setdefault(names[class_id], {"active": 0, "pending": 0})
                bucket[state] += amount
            return totals


# How far a report's ``as_of`` may stray from the server's clock. A report from the future
# would release claims made after it; one older than a day describes a host that has long
# moved on. Both are refused, before anything is stored.
AS_OF_FUTURE = timedelta(minutes=5)
AS_OF_PAST = timedelta(days=1)


def check_as_of(as_of: datetime | None) -> datetime:
    """``as_of`` as naive UTC (a time without a zone is taken to be UTC already) if the
    server's clock allows it; now if None."""
    current = now()
    if as_of is None:
        return current
    if as_of.tzinfo is not None:
        try:
            as_of = as_of.astimezone(UTC).replace(tzinfo=None)
        except OverflowError:
            raise ValidationError(
                f"as_of {as_of.isoformat()} is outside the range of dates", field="as_of"
            ) from None
    if as_of > current + AS_OF_FUTURE or as_of < current - AS_OF_PAST:
        raise ValidationError(
            f"as_of {as_of.isoformat()} (UTC) is more than {AS_OF_FUTURE} ahead of or "
            f"{AS_OF_PAST} behind the server's clock ({current.isoformat()})",
            field="as_of",
        )
    return as_of


def _sum_by_class(records: Iterable[AllocationRecord]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for r in records:
        totals[r.resource_class] = totals.get(r.resource_class, 0) + r.amount
    return totals


def _lock_vms(session: Session, uuids: set[str]) -> dict[str, VmRow]:
    """The VMs by uuid, locked in id order (see ``lookup.vm_row``)."""
    found: dict[str, VmRow] = {}
    for chunk in in_chunks(sorted(uuids)):
        query = select(VmRow).where(VmRow.uuid.in_(chunk)).order_by(VmRow.id).with_for_update()
        for row in session.scalars(query):
            found[row.uuid] = row
    return found


def _hosts_by_ident(session: Session, idents: set[str]) -> dict[str, HostRow]:
    """The hosts by each ident given (a name, or a uuid in any case)."""
    found: dict[str, HostRow] = {}
    for chunk in in_chunks(sorted(idents)):
        uuids = [lookup.canonical_uuid(i) for i in chunk]
        for row in session.scalars(
            select(HostRow).where(HostRow.uuid.in_(uuids) | HostRow.name.in_(chunk))
        ):
            found[row.uuid] = row
            found[row.name] = row
    for ident in idents:
        if ident not in found and lookup.canonical_uuid(ident) in found:
            found[ident] = found[lookup.canonical_uuid(ident)]
    return found


def _problem(tree: _Tree, provider: HostRow, name: str, class_id: int, amount: int) -> str:
    """Why ``provider`` cannot hold ``amount`` of the class now ("" when it can)."""
    inventory = tree.inventories.get((provider.id, class_id))
    if inventory is None:
        return f"{name} on {provider.name}: no inventory"
    unit_problem = inventory.unit_problem(amount)
    if unit_problem:
        return f"{name} on {provider.name}: {unit_problem}"
    used = tree.used.get((provider.id, class_id), {})
    active, pending = used.get("active", 0), used.get("pending", 0)
    if active + pending + amount <= inventory.capacity:
        return ""
    return (
        f"{name} on {provider.name}: needs {amount}, "
        f"{inventory.capacity - active - pending} free of capacity {inventory.capacity} "
        f"({active} active, {pending} pending)"
    )


def _load_trees(session: Session, root_ids: set[int]) -> dict[int, _Tree]:
    providers = list(
        session.scalars(select(HostRow).where(HostRow.root_id.in_(root_ids)).order_by(HostRow.id))
    )
    trees: dict[int, _Tree] = {}
    for p in providers:
        if p.id == p.root_id:
            trees[p.id] = _Tree(root=p, providers=[])
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
    return trees


def _generation(session: Session, host_id: int | None) -> int:
    return int(session.scalar(select(HostRow.generation).where(HostRow.id == host_id)) or 0)


def _drop_pending(session: Session, vm: VmRow) -> set[int]:
    """Delete a pending VM's records (it is re-placed); the providers they were on."""
    rows = list(session.scalars(select(AllocationRow).where(AllocationRow.vm_id == vm.id)))
    for r in rows:
        session.delete(r)
    return _with_roots(session, {r.host_id for r in rows})


def _tree_ids(session: Session, root_id: int | None) -> set[int]:
    return set(session.scalars(select(HostRow.id).where(HostRow.root_id == root_id)))


def _with_roots(session: Session, host_ids: set[int]) -> set[int]:
    """The touched providers and their roots: a change under a root is a change of its host."""
    rows = session.execute(
        select(HostRow.id, HostRow.root_id).where(HostRow.id.in_(host_ids))
    ).all()
    return set(host_ids) | {root for _, root in rows if root}
