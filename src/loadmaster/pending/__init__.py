"""Pending and active allocations: claims, activation, release and reconciliation."""

from loadmaster.pending.audit import Problem, audit, group_rule_problems
from loadmaster.pending.ledger import Claim, ClaimOutcome, FailOutcome, Ledger, ReconcileResult

__all__ = [
    "Claim",
    "ClaimOutcome",
    "FailOutcome",
    "Ledger",
    "Problem",
    "ReconcileResult",
    "audit",
    "group_rule_problems",
]
