"""Host reports: what each host's agent measured, for the load weigher."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from loadmaster.cluster import lookup
from loadmaster.errors import ValidationError
from loadmaster.store import Store
from loadmaster.store.locking import now
from loadmaster.store.schema import HostReportRow


def _measures(data: object, field: str) -> dict[str, float]:
    if not isinstance(data, Mapping):
        raise ValidationError(f"{field} must be an object of name: number", field=field)
    out = {}
    for key, value in data.items():
        if (
            not isinstance(key, str)
            or isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValidationError(
                f"{field}.{key} must be a finite number of at least 0, got {value!r}",
                field=f"{field}.{key}",
            )
        out[key] = float(value)
    return out


def check_measures(
    usage: Mapping[str, float], load: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """``usage`` and ``load`` as numbers, or a ``ValidationError`` naming the entry."""
    return _measures(usage, "usage"), _measures(load, "load")


def record_report(
    store: Store,
    host: str,
    usage: Mapping[str, float],
    load: Mapping[str, float],
    running_vms: Sequence[str] | None,
    *,
    at: datetime | None = None,
) -> None:
    """Keep the latest report of ``host``: measured ``usage`` per class, ``load`` per
    dimension as a fraction of the host (cpu 0.7 = 70 % busy), the VMs it runs (None:
    those of the report before; empty figures, likewise). The caller reconciles the ledger with ``running_vms``
    (``lm.allocations.reconcile``); this only feeds the scheduler."""
    usage_values, load_values = check_measures(usage, load)
    if running_vms is not None and (
        isinstance(running_vms, str) or not all(isinstance(v, str) for v in running_vms)
    ):
        raise ValidationError("running_vms must be a list of VM uuids", field="running_vms")
    with store.write() as session:
        row = lookup.host_row(session, host)
        report = session.get(HostReportRow, row.id)
        if report is None:
            report = _first_report(session, row.id)
        report.reported_at = at or now()
        # A report without figures (the host manager's: VMs only) keeps the last ones.
        if usage_values:
            report.usage = usage_values
        if load_values:
            report.load = load_values
        if running_vms is not None:
            report.running_vms = [lookup.canonical_uuid(v) for v in running_vms]


def _first_report(session: Session, host_id: int) -> HostReportRow:
    """The host's report row, made empty if it has none. A host's first reports may
    arrive together (PostgreSQL: two inserts of the row collided, and one report was
    refused): each inserts it unless another did, then they take turns on it."""
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(
        insert(HostReportRow)
        .values(host_id=host_id, reported_at=now(), usage={}, load={}, running_vms=[])
        .on_conflict_do_nothing(index_elements=["host_id"])
    )
    report = session.get(HostReportRow, host_id, with_for_update=True, populate_existing=True)
    assert report is not None  # inserted above, or by another report
    return report


def write_measurements(
    session: Session, measured: Mapping[int, tuple[Mapping[str, float], Mapping[str, float]]]
) -> None:
    """Many hosts' latest measurements (host id -> (usage, load), already checked) in
    one statement per kind of report (both figures, usage alone, load alone: a figure
    not reported keeps its last value), stamped now: what a server heard from its agents
    since its last flush, written as liveness is, not a transaction per report."""
    at = now()
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    kinds: dict[tuple[bool, bool], list[dict[str, object]]] = {}
    for host_id, (usage, load) in measured.items():
        row = {
            "host_id": host_id,
            "reported_at": at,
            "usage": dict(usage),
            "load": dict(load),
            "running_vms": [],
        }
        kinds.setdefault((bool(usage), bool(load)), []).append(row)
    for (has_usage, has_load), rows in sorted(kinds.items()):
        statement = insert(HostReportRow)
        kept = {"reported_at": statement.excluded.reported_at}
        if has_usage:
            kept["usage"] = statement.excluded.usage
        if has_load:
            kept["load"] = statement.excluded.load
        session.execute(
            statement.on_conflict_do_update(index_elements=["host_id"], set_=kept), rows
        )
