"""Consistency audit: what must always hold between VMs, records and inventories.

Operators run it after an incident (``loadmaster audit``); the crash and soak tests run it
after killing processes and restarting the database. An empty list means consistent.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import func, select

from loadmaster.cluster import lookup
from loadmaster.cluster.vms import PLACED_STATES
from loadmaster.resources.traits import SHARING_TRAIT
from loadmaster.store import Store
from loadmaster.store.schema import (
    AllocationRow,
    ConsumerRow,
    FlavorRow,
    HostAgentRow,
    HostReportRow,
    HostRow,
    HostTraitRow,
    InventoryRow,
    ServerGroupRow,
    TraitRow,
    VmRow,
)


@dataclass(frozen=True)
class Problem:
    # over_capacity | orphaned | partial_claim | state_mismatch | group_rule | not_running
    # | on_down_host
    kind: str
    subject: str
    detail: str


def audit(store: Store) -> list[Problem]:
    problems: list[Problem] = []
    with store.read() as session:
        names = lookup.class_names(session)
        hosts = dict(session.execute(select(HostRow.id, HostRow.name)).all())
        used = dict(
            ((h, c), int(total))
            for h, c, total in session.execute(
                select(
                    AllocationRow.host_id,
                    AllocationRow.resource_class_id,
                    func.sum(AllocationRow.amount),
                ).group_by(AllocationRow.host_id, AllocationRow.resource_class_id)
            ).all()
        )
        capacity = {
            (inv.host_id, inv.resource_class_id): lookup.inventory_of(inv).capacity
            for inv in session.scalars(select(InventoryRow))
        }
        for key, amount in sorted(used.items()):
            if amount > capacity.get(key, 0):
                problems.append(
                    Problem(
                        "over_capacity",
                        hosts[key[0]],
                        f"{names[key[1]]}: {amount} allocated, capacity {capacity.get(key, 0)}",
                    )
                )
        records: dict[int, list[AllocationRow]] = defaultdict(list)
        for row in session.scalars(select(AllocationRow)):
            records[row.consumer_id].append(row)
        flavors = {f.id: f for f in session.scalars(select(FlavorRow))}
        roots = dict(session.execute(select(HostRow.id, HostRow.root_id)).all())
        sharing = set(
            session.scalars(
                select(HostTraitRow.host_id)
                .join(TraitRow, TraitRow.id == HostTraitRow.trait_id)
                .where(TraitRow.name == SHARING_TRAIT)
            )
        )
        for vm in session.scalars(select(VmRow)):
            mine = records.pop(vm.consumer_id, [])
            flavor = flavors.get(vm.flavor_id) if vm.flavor_id is not None else None
            problems.extend(_check_vm(vm, mine, flavor, roots, names, sharing))
        consumers = dict(session.execute(select(ConsumerRow.id, ConsumerRow.uuid)).all())
        for consumer_id, rows in records.items():
            # What is left belongs to plain (Placement) consumers: in use, never pending.
            if consumer_id not in consumers:
                problems.append(
                    Problem("orphaned", str(consumer_id), f"{len(rows)} records of no consumer")
                )
            elif any(r.state != "active" for r in rows):
                problems.append(
                    Problem(
                        "pending_without_vm",
                        consumers[consumer_id],
                        "a consumer that is no VM holds pending records: nothing would end them",
                    )
                )
    return problems + group_rule_problems(store) + world_problems(store)


def world_problems(store: Store) -> list[Problem]:
    """Where the ledger and its hosts disagree, read in one snapshot: a VM the ledger has
    running or pending on a host that is down (fenced or confirmed down: the VM runs
    nowhere until it is placed again), and a VM it has running on a host whose agent's
    last report lists no such guest although the agent knew it ran there (its stamp,
    ``host_seq``, at or below the generation the agent had seen). The reconciliation of
    that report would have stopped such a VM: the ledger came to believe it since, behind
    the reports' back."""
    with store.read() as session:
        rows = session.execute(
            select(
                VmRow.uuid,
                VmRow.state,
                VmRow.host_seq,
                HostRow.name,
                HostRow.state,
                HostAgentRow.seen_generation,
                HostReportRow.running_vms,
            )
            .join(HostRow, HostRow.id == VmRow.host_id)
            .outerjoin(HostAgentRow, HostAgentRow.host_id == HostRow.id)
            .outerjoin(HostReportRow, HostReportRow.host_id == HostRow.id)
            .where(VmRow.state.in_(("pending", "running")))
            .order_by(VmRow.id)
        ).all()
    problems = []
    for vm, state, stamp, host, host_state, seen, listed in rows:
        if host_state == "down":
            problems.append(
                Problem(
                    "on_down_host",
                    vm,
                    f"{state} on host {host}, which is down: it runs nowhere until it is "
                    f"placed again (loadmaster host evacuate {host})",
                )
            )
        elif (
            state == "running"
            and seen
            and listed is not None
            and (stamp or 1) <= seen
            and vm not in listed
        ):
            problems.append(
                Problem(
                    "not_running",
                    vm,
                    f"running on host {host} in the ledger, but the last report of its agent "
                    f"(having seen generation {seen}) lists no such guest",
                )
            )
    return problems


def group_rule_problems(store: Store) -> list[Problem]:
    """Every broken hard server-group rule, read in one statement (one snapshot).

    A member counts on its host and, while migrating, on its destination too (it holds
    both). Anti-affinity and ``max_per_host`` cap the members per host; affinity needs one
    host shared by every member."""
    with store.read() as session:
        rows = session.execute(
            select(
                ServerGroupRow.name,
                ServerGroupRow.policy,
                ServerGroupRow.max_per_host,
                VmRow.host_id,
                VmRow.target_host_id,
            )
            .join(VmRow, VmRow.group_id == ServerGroupRow.id)
            .where(VmRow.state.in_(PLACED_STATES))
        ).all()
    members: dict[tuple[str, str, int | None], list[set[int]]] = defaultdict(list)
    for name, policy, cap, host, target in rows:
        members[(name, policy, cap)].append({h for h in (host, target) if h is not None})
    problems = []
    for (name, policy, cap), hosts in sorted(members.items()):
        if policy == "affinity" and not set.intersection(*hosts):
            problems.append(Problem("group_rule", name, f"affinity group split over {hosts}"))
        limit = cap or (1 if policy == "anti-affinity" else None)
        if limit is None:
            continue
        per_host: dict[int, int] = defaultdict(int)
        for member in hosts:
            for h in member:
                per_host[h] += 1
        over = {h: n for h, n in sorted(per_host.items()) if n > limit}
        if over:
            problems.append(
                Problem("group_rule", name, f"{policy}: more than {limit} per host on {over}")
            )
    return problems


def _check_vm(
    vm: VmRow,
    rows: list[AllocationRow],
    flavor: FlavorRow | None,
    roots: dict[int, int | None],
    names: dict[int, str],
    sharing: set[int],
) -> list[Problem]:
    """``sharing``: the sharing providers: records there (a disk on a pool) count for
    the VM's host, and a migration's destination counts those its source holds."""
    wanted = lookup.effective_resources(flavor.resources if flavor else {}, vm.overrides)
    if vm.state in ("requested", "stopped", "deleted"):
        if rows:
            return [Problem("orphaned", vm.uuid, f"{len(rows)} records while the VM is {vm.state}")]
        return []
    expected: list[tuple[int | None, str]] = {
        "pending": [(vm.host_id, "pending")],
        "running": [(vm.host_id, "active")],
        "migrating": [(vm.host_id, "active"), (vm.target_host_id, "pending")],
    }[vm.state]
    problems = []
    shared = [
        r for r in rows if r.host_id in sharing and roots.get(r.host_id) not in dict(expected)
    ]
    for host_id, state in expected:
        held: dict[str, int] = defaultdict(int)
        for r in rows:
            if roots.get(r.host_id) == host_id and r.state == state:
                held[names[r.resource_class_id]] += r.amount
        for r in shared:
            if r.state == state:
                held[names[r.resource_class_id]] += r.amount
        if state == "pending" and vm.state == "migrating":
            for r in shared:  # kept from the source, not claimed again
                if r.state == "active" and names[r.resource_class_id] not in held:
                    held[names[r.resource_class_id]] += r.amount
        if dict(held) != wanted:
            problems.append(
                Problem(
                    "partial_claim",
                    vm.uuid,
                    f"{vm.state}: {state} records {dict(held)} != needs {wanted}",
                )
            )
    stray = [r for r in rows if (roots.get(r.host_id), r.state) not in expected and r not in shared]
    if stray:
        problems.append(
            Problem("state_mismatch", vm.uuid, f"{len(stray)} records do not fit state {vm.state}")
        )
    return problems
