"""Claims waiting on a host that cannot act: pending longer than a threshold on a host
whose agent is silent or absent. They are shown (``vm list``, ``host show``, ``audit``),
never ended: an agent that comes back may still be launching them, and only an operator
who knows the host is down may move its VMs (``host evacuate --confirm-down``)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from loadmaster.cluster.host_rows import silences
from loadmaster.cluster.liveness import Silence, epoch, utc_text
from loadmaster.store import Store
from loadmaster.store.locking import now
from loadmaster.store.schema import AllocationRow, HostRow, VmRow

# Seconds a claim may stay pending on a host that cannot act before it is shown.
DEFAULT_WARN_AFTER_S = 300.0


@dataclass(frozen=True)
class WaitingClaim:
    vm: str
    name: str
    since: datetime  # when the claim was made (naive UTC)
    agent: Silence

    @property
    def warning(self) -> str:
        return (
            f"VM {self.name} has been pending on host {self.agent.host} since "
            f"{utc_text(epoch(self.since))}: {self.agent.describe()}; the claim is kept"
        )

    def to_dict(self) -> dict[str, object]:
        return {"vm": self.vm, "host": self.agent.host, "warning": self.warning}


class WaitingClaims:
    """``lm.waiting``. ``silent_after``: the agents' silence limit now (it may be changed
    at run time); ``warn_after``: seconds a claim waits before it is shown."""

    def __init__(
        self,
        store: Store,
        silent_after: Callable[[], timedelta],
        warn_after: float = DEFAULT_WARN_AFTER_S,
    ) -> None:
        self._store = store
        self._silent_after = silent_after
        self.warn_after = timedelta(seconds=warn_after)

    def find(
        self,
        *,
        vms: Collection[str] | None = None,
        host: str | None = None,
        session: Session | None = None,
    ) -> list[WaitingClaim]:
        """The waiting claims, oldest first: of these VMs (uuids), or on this root host,
        or all of them."""
        at = now()
        root = func.coalesce(HostRow.root_id, HostRow.id)
        query = (
            select(VmRow.uuid, VmRow.name, root, func.min(AllocationRow.created_at))
            .join(VmRow, VmRow.consumer_id == AllocationRow.consumer_id)
            .join(HostRow, HostRow.id == AllocationRow.host_id)
            .where(
                AllocationRow.state == "pending",
                AllocationRow.created_at <= at - self.warn_after,
            )
            .group_by(VmRow.uuid, VmRow.name, root)
        )
        if vms is not None:
            if not vms:
                return []
            query = query.where(VmRow.uuid.in_(sorted(vms)))
        with self._store.read(session) as session:
            if host is not None:
                query = query.where(
                    root == select(HostRow.id).where(HostRow.name == host).scalar_subquery()
                )
            rows = session.execute(query).all()
            silent = silences(
                session, {r[2] for r in rows}, self._silent_after().total_seconds(), at
            )
        waiting = [
            WaitingClaim(uuid, name, since, silent[host_id])
            for uuid, name, host_id, since in rows
            if host_id in silent
        ]
        return sorted(waiting, key=lambda w: (w.since, w.name))
