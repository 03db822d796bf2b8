"""Hard server-group rules, checked in the transaction that writes the claims.

The scheduler applies the same rules to its snapshot, and host generations catch most
races: two anti-affinity members sent to one host by two schedulers bump the same
generation, so the second claim fails. Generations cannot catch the first members of an
affinity group sent to two *different* hosts at once. So a claim locks the rows of its
VMs' groups (in id order, before any host row) and checks the members as committed: claims
for one group take turns, claims for different groups do not wait for each other.

A migrating VM counts on its source *and* its destination (it holds records on both until
the migration completes or aborts). So max_per_host and anti-affinity count it on both, and
affinity holds while some host is shared by every member's set of hosts: a whole group can
move from A to B through the state where every member is on A and headed to B.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, select

from loadmaster.cluster.vm_rows import VmState
from loadmaster.cluster.vms import PLACED_STATES
from loadmaster.errors import GroupPolicyViolation
from loadmaster.pending.trees import ProviderRow
from loadmaster.store import Prepared, run_chunked
from loadmaster.store.locking import lock_groups
from loadmaster.store.schema import VmRow
from loadmaster.store.transaction import Transaction


@dataclass
class GroupRules:
    groups: dict[int, Any]  # rows of lock_groups
    # group id -> member VM id -> root hosts it runs on or is headed to
    members: dict[int, dict[int, set[int]]] = field(default_factory=dict)
    # group id -> root host -> how many members count there: a batch of a 1,000-member
    # anti-affinity group checks each claim in constant time, not by walking the members.
    on_host: dict[int, Counter[int]] = field(default_factory=dict)
    # VMs of this batch evacuated from a host that is down: once claimed they count only
    # on their new host.
    evacuating: set[int] = field(default_factory=set)

    @classmethod
    def lock(cls, session: Transaction, group_ids: Collection[int]) -> GroupRules:
        if not group_ids:
            return cls({})
        groups = {g.id: g for g in lock_groups(session, group_ids)}
        rules = cls(groups, {gid: {} for gid in groups}, {gid: Counter() for gid in groups})
        placed = run_chunked(session, _PLACED_MEMBERS, "ids", sorted(groups))
        for vm_id, group_id, host_id, target_id in placed:
            assert group_id is not None  # selected by group
            hosts = {h for h in (host_id, target_id) if h is not None}
            rules.members[group_id][vm_id] = hosts
            rules.on_host[group_id].update(hosts)
        return rules

    def check(
        self,
        vm: VmState,
        host: ProviderRow,
        prefix: str = "",
        *,
        moving: Collection[int] = (),
    ) -> None:
        """Refuse ``vm`` on root ``host`` if that breaks its group's hard rule.

        ``moving``: VMs of this batch that are pending and re-placed later in it (a drain);
        where they are now does not bind ``vm``, since they are about to follow. The batch's
        end is checked by ``split_groups``."""
        group = self.groups.get(vm.group_id) if vm.group_id is not None else None
        if group is None:
            return
        if group.policy == "affinity":
            binding = [
                hosts
                for vm_id, hosts in self.members[group.id].items()
                if vm_id != vm.id and vm_id not in moving
            ]
            if not _shared(binding, self.hosts_after(vm, host)):
                raise GroupPolicyViolation(
                    f"{prefix}vm {vm.uuid}: affinity group {group.name} already has members "
                    f"on another host; it cannot go to {host.name}",
                    field=f"{prefix}host",
                )
        limit = group.max_per_host or (1 if group.policy == "anti-affinity" else None)
        host_id = host.id
        already = self.on_host[group.id][host_id] - (
            host_id in self.members[group.id].get(vm.id, ())
        )
        if limit is not None and already >= limit:
            raise GroupPolicyViolation(
                f"{prefix}vm {vm.uuid}: host {host.name} already has {limit} member(s) of "
                f"{group.policy} group {group.name}",
                field=f"{prefix}host",
            )

    def add(self, vm: VmState, host: ProviderRow) -> None:
        """A claim of this batch landed: later claims of the batch see it. Call before
        the VM's row changes: ``hosts_after`` reads its state."""
        if vm.group_id is not None and vm.group_id in self.members:
            counts = self.on_host[vm.group_id]
            counts.subtract(self.members[vm.group_id].get(vm.id, ()))
            hosts = self.hosts_after(vm, host)
            counts.update(hosts)
            self.members[vm.group_id][vm.id] = hosts

    def hosts_after(self, vm: VmState, host: ProviderRow) -> set[int]:
        """Where ``vm`` counts once claimed on ``host``: a running VM migrates (source and
        destination); a pending VM re-placed, or one evacuated, leaves its old host; a new
        one is only there."""
        if vm.state == "running" and vm.host_id is not None and vm.id not in self.evacuating:
            return {vm.host_id, host.id}
        return {host.id}

    def split_groups(self, only: Collection[int | None] | None = None) -> list[int]:
        """Ids of the affinity groups (of ``only``) whose members share no host."""
        return [
            gid
            for gid, group in self.groups.items()
            if (only is None or gid in only)
            and group.policy == "affinity"
            and not _shared(self.members[gid].values(), set())
        ]


def _shared(member_hosts: Iterable[set[int]], hosts: set[int]) -> bool:
    """Whether some host is common to ``hosts`` (if not empty) and every member's set."""
    common: set[int] | None = set(hosts) if hosts else None
    for member in member_hosts:
        common = set(member) if common is None else common & member
        if not common:
            return False
    return True


_PLACED_MEMBERS = Prepared(
    select(VmRow.id, VmRow.group_id, VmRow.host_id, VmRow.target_host_id).where(
        VmRow.group_id.in_(bindparam("ids", expanding=True)), VmRow.state.in_(PLACED_STATES)
    )
)
