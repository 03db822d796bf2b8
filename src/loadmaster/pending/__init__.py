"""Pending and active allocations: claims, activation, release and reconciliation.

``Ledger`` is the front (one transaction per call); ``claims``, ``lifecycle``,
``reconcile`` and ``usage`` do the work inside it; ``trees`` reads a host's provider tree.
"""

from loadmaster.pending.audit import Problem, audit, group_rule_problems
from loadmaster.pending.claims import CLAIM_INTENTS, Claim, ClaimOutcome
from loadmaster.pending.ledger import Ledger
from loadmaster.pending.lifecycle import FailOutcome
from loadmaster.pending.reconcile import ReconcileResult, check_as_of

__all__ = [
    "CLAIM_INTENTS",
    "Claim",
    "ClaimOutcome",
    "FailOutcome",
    "Ledger",
    "Problem",
    "ReconcileResult",
    "audit",
    "check_as_of",
    "group_rule_problems",
]
