"""Pending and active allocations: claims, activation, release and reconciliation."""

from loadmaster.pending.audit import Problem, audit
from loadmaster.pending.ledger import Claim, ClaimOutcome, Ledger, ReconcileResult

__all__ = ["Claim", "ClaimOutcome", "Ledger", "Problem", "ReconcileResult", "audit"]
