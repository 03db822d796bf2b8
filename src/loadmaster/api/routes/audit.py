"""The ledger audit of a running server, for operators who cannot reach its database."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter

from loadmaster.api.deps import LM
from loadmaster.api.responses import AuditOut
from loadmaster.pending import audit as run_audit

router = APIRouter(tags=["operations"])


@router.get("/audit", response_model=AuditOut)
def audit(lm: LM) -> dict[str, Any]:
    """The ledger's broken promises (none: an empty list): hosts over capacity, orphaned
    or partial claims, VM states not matching their records, group rules broken; and
    where it disagrees with its hosts: VMs running or pending on a host that is down, VMs
    running on a host whose agent's last report lists no such guest. Reads only, so a
    reader token may ask. ``warnings``: claims pending too long on hosts whose
    agent is silent or absent (kept, not problems)."""
    return {
        "problems": [asdict(p) for p in run_audit(lm.store)],
        "warnings": [w.warning for w in lm.waiting.find()],
    }
