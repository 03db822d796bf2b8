"""Named policies, like oVirt's cluster policies: which weighers, with which multipliers.

Every registered filter runs, because each one only acts on requests that ask for what it
checks, unless a policy switches it off by name (``disabled_filters``, as a
kube-scheduler profile disables a plugin); the ledger still refuses what does not fit. Soft group preferences weigh ten times
the rest so that they decide whenever the hard constraints leave a choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from loadmaster.scheduler.plugins import WeigherSetting

# Spreading policies score a random sample of feasible hosts (kube-scheduler scores 5% of
# a 10,000-node cluster); packing scores every one, since the fullest host is rare.
SPREAD_SAMPLE = 500
SOFT_GROUPS = (WeigherSetting("soft_affinity", 10.0), WeigherSetting("soft_anti_affinity", 10.0))


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    weighers: tuple[WeigherSetting, ...]
    # Score a random sample of this many feasible hosts instead of all of them (None: all).
    sample: int | None = None
    disabled_filters: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "sample": self.sample,
            "disabled_filters": list(self.disabled_filters),
            "weighers": [
                {"name": w.name, "multiplier": w.multiplier, "options": dict(w.options)}
                for w in self.weighers
            ],
        }


POLICIES: Mapping[str, Policy] = {
    p.name: p
    for p in (
        Policy(
            "spread",
            "even distribution: the emptiest host for every class the VM uses, "
            "balanced classes, lowest measured load",
            (
                WeigherSetting("spread", 1.0),
                WeigherSetting("balance", 0.5),
                WeigherSetting("load", 1.0),
                *SOFT_GROUPS,
            ),
            sample=SPREAD_SAMPLE,
        ),
        Policy(
            "pack",
            "power saving: fill the busiest hosts first and leave the others empty",
            (WeigherSetting("pack", 1.0), WeigherSetting("balance", 0.25), *SOFT_GROUPS),
        ),
        Policy(
            "vm-count",
            "even number of VMs per host, whatever their size",
            (WeigherSetting("vm_count", 1.0), WeigherSetting("spread", 0.1), *SOFT_GROUPS),
            sample=SPREAD_SAMPLE,
        ),
    )
}
DEFAULT_POLICY = "spread"
