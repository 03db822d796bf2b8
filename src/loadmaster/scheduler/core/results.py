"""What the scheduler answers: placements, explanations and capacity, all JSON-ready."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadmaster.errors import LoadmasterError, NoValidHost


@dataclass(frozen=True)
class FilterCount:
    """How many hosts one filter removed, and why (reason -> hosts)."""

    filter: str
    removed: int
    reasons: dict[str, int]

    def to_dict(self) -> dict[str, object]:
        return {"filter": self.filter, "removed": self.removed, "reasons": dict(self.reasons)}


@dataclass(frozen=True)
class HostScore:
    """One feasible host's score: the sum of each weigher's multiplier times its score,
    rescaled to [0, 1] over the candidates (``by_weigher``)."""

    host: str
    total: float
    by_weigher: dict[str, float]

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "total": self.total, "by_weigher": dict(self.by_weigher)}


@dataclass(frozen=True)
class Explanation:
    """Why hosts were ruled out for one VM. Each host is blamed on the first filter (in
    filter order) that rejected it, so ``sum(removed) + candidates == hosts``."""

    vm: str
    hosts: int
    candidates: int
    filters: tuple[FilterCount, ...]
    # The reason in a group's terms when a hard group rule is what leaves no host.
    headline: str | None = None
    # When hosts fit: the best ones as the policy scored them, best first.
    ranking: tuple[HostScore, ...] = ()
    # With one host named: each filter that rejects it, with its reason.
    host_reasons: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        reasons = sorted(
            ((count, reason) for f in self.filters for reason, count in f.reasons.items()),
            key=lambda item: (-item[0], item[1]),
        )
        detail = ", ".join(f"{count} {reason}" for count, reason in reasons)
        head = "no host fits" if self.candidates == 0 else f"{self.candidates} hosts fit"
        if self.headline:
            head = f"{self.headline}; {head}"
        return f"{head}: {self.hosts} hosts" + (f"; {detail}" if detail else "")

    def host_refusal(self) -> str:
        """Why the one host the request named is refused (see ``host_reasons``), led by
        a group rule's headline when there is one."""
        return "; ".join(([self.headline] if self.headline else []) + list(self.host_reasons))

    def to_dict(self) -> dict[str, object]:
        return {
            "vm": self.vm,
            "hosts": self.hosts,
            "candidates": self.candidates,
            "headline": self.headline,
            "message": self.message,
            "filters": [f.to_dict() for f in self.filters],
            "ranking": [r.to_dict() for r in self.ranking],
        }


class NoHostFits(NoValidHost):
    """``NoValidHost`` with the per-filter explanation attached; ``pinned``: the one host
    the request named, refused in that host's terms."""

    def __init__(
        self,
        explanation: Explanation,
        pinned: str | None = None,
        intent: str = "start",
        name: str | None = None,
    ) -> None:
        """``name``: the VM's, for the message (the explanation knows its uuid)."""
        vm = name or explanation.vm
        if pinned is None:
            super().__init__(f"VM {vm}: {explanation.message}", field="vm")
        else:
            verb = "move to" if intent == "migrate" else "start on"
            super().__init__(
                f"VM {vm} cannot {verb} host {pinned}: {explanation.host_refusal()}",
                field="host",
            )
        self.explanation = explanation

    def to_dict(self) -> dict[str, object]:
        body = super().to_dict()
        body["explanation"] = self.explanation.to_dict()
        return body


@dataclass(frozen=True)
class Placement:
    """One VM's outcome: ``host`` when placed (claimed, or chosen in a dry run), else
    ``error`` says why (``NoHostFits`` carries the explanation). ``vm`` is a uuid, or
    ``flavor#n`` for a hypothetical VM. ``decision_seconds`` is the time spent choosing.
    ``scores`` (dry runs): the chosen host's score per weigher, then the runners-up's."""

    vm: str
    host: str | None
    error: LoadmasterError | None = None
    decision_seconds: float = 0.0
    attempts: int = 1
    scores: tuple[HostScore, ...] = ()

    @property
    def ok(self) -> bool:
        return self.host is not None and self.error is None

    @property
    def explanation(self) -> Explanation | None:
        return self.error.explanation if isinstance(self.error, NoHostFits) else None

    def to_dict(self) -> dict[str, object]:
        return {
            "vm": self.vm,
            "host": self.host,
            "error": None if self.error is None else self.error.to_dict(),
            "decision_seconds": self.decision_seconds,
            "attempts": self.attempts,
            "scores": [score.to_dict() for score in self.scores],
        }


# A dry run answers with at most this many per-VM placements (the rest are summarised).
DRY_RUN_LISTED = 100


@dataclass(frozen=True)
class ScheduleResult:
    placements: tuple[Placement, ...]
    gang: bool
    dry_run: bool
    policy: str
    conflicts: int = 0
    seconds: float = 0.0
    # The seed the call's random choices were drawn with: give it again to replay them.
    seed: int | None = None

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.placements)

    @property
    def placed(self) -> dict[str, str]:
        return {p.vm: p.host for p in self.placements if p.host is not None}

    @property
    def failed(self) -> list[Placement]:
        return [p for p in self.placements if not p.ok]

    def failure_reasons(self) -> list[dict[str, object]]:
        """One entry per distinct reason, with how many VMs it kept out (most first): a
        gang or a group that fails as one says so once, not once per VM."""
        counts: dict[tuple[str, str], int] = {}
        for p in self.failed:
            if p.error is None:
                continue
            explanation = p.explanation
            reason = explanation.message if explanation is not None else p.error.detail
            key = (p.error.code, reason)
            counts[key] = counts.get(key, 0) + 1
        return [
            {"code": code, "reason": reason, "vms": n}
            for (code, reason), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ]

    def to_dict(self) -> dict[str, object]:
        """A real run lists every VM (each has its own host to learn). A dry run of many
        hypothetical VMs is summarised: how many per host and per error, and the first
        ``DRY_RUN_LISTED`` placements, with ``listed`` saying how many are shown."""
        shown = self.placements
        if self.dry_run and len(shown) > DRY_RUN_LISTED:
            shown = shown[:DRY_RUN_LISTED]
        by_host: dict[str, int] = {}
        errors: dict[str, int] = {}
        for p in self.placements:
            if p.host is not None:
                by_host[p.host] = by_host.get(p.host, 0) + 1
            if p.error is not None:
                errors[p.error.code] = errors.get(p.error.code, 0) + 1
        return {
            "ok": self.ok,
            "gang": self.gang,
            "dry_run": self.dry_run,
            "policy": self.policy,
            "seed": self.seed,
            "placed": len(self.placed),
            "failed": len(self.failed),
            "conflicts": self.conflicts,
            "seconds": self.seconds,
            "by_host": dict(sorted(by_host.items())),
            "errors": dict(sorted(errors.items())),
            "failure_reasons": self.failure_reasons(),
            "listed": len(shown),
            "placements": [p.to_dict() for p in shown],
        }


@dataclass(frozen=True)
class CapacityReport:
    """How many more VMs of ``flavor`` fit now (pending counted as used), and where:
    ``per_host`` most first, and for every host where none fits, ``limits`` says why."""

    flavor: str
    total: int
    per_host: dict[str, int] = field(default_factory=dict)
    group: str | None = None
    limits: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "flavor": self.flavor,
            "group": self.group,
            "total": self.total,
            "per_host": dict(self.per_host),
            "limits": dict(self.limits),
        }
