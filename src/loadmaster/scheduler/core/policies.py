"""Named policies, like oVirt's cluster policies and kube-scheduler's profiles: which
filters run, and which weighers with which multipliers.

Every registered filter runs, because each one only acts on requests that ask for what it
checks, unless a policy names the only ones it runs (``filters``) or switches some off
(``disabled_filters``, as a kube-scheduler profile disables a plugin); the ledger still
refuses what does not fit. Soft group preferences weigh ten times the rest so that they
decide whenever the hard constraints leave a choice.

Operators add policies in a TOML file (the ``policies_file`` setting)::

    [policies.gpu-pack]
    description = "fill GPU hosts one by one"
    weighers = [{name = "pack", multiplier = 1.0, options = {classes = ["CUSTOM_GPU"]}}]
    disabled_filters = ["aggregates"]   # or: filters = ["host_state", "resources"]
    sample = 200                        # score this many feasible hosts (default: all)
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadmaster.errors import ValidationError
from loadmaster.scheduler.core.plugins import WeigherSetting
from loadmaster.settings import read_operator_file

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
    # The only filters this policy runs, in their usual order (None: every registered one).
    filters: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "sample": self.sample,
            "disabled_filters": list(self.disabled_filters),
            "filters": None if self.filters is None else list(self.filters),
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


def load_policy_file(path: Path) -> dict[str, Policy]:
    """The policies of an operator's TOML file (see the module docstring); every error
    names the file and the setting."""
    try:
        data = tomllib.loads(read_operator_file(path, "policies_file"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValidationError(f"{path}: {exc}", field="policies_file") from exc
    unknown = sorted(set(data) - {"policies"})
    if unknown:
        raise ValidationError(
            f"{path}: [{unknown[0]}] is not a section (known: policies)", field=unknown[0]
        )
    tables = data.get("policies", {})
    if not isinstance(tables, dict):
        raise ValidationError(f"{path}: policies must be a table", field="policies")
    return {
        name: _policy(str(name), table, f"{path}: policies.{name}")
        for name, table in tables.items()
    }


POLICY_KEYS = {"description", "weighers", "sample", "disabled_filters", "filters"}


def _policy(name: str, table: Any, where: str) -> Policy:
    if not isinstance(table, dict):
        raise ValidationError(f"{where} must be a table", field=f"policies.{name}")
    for key in table:
        if key not in POLICY_KEYS:
            raise ValidationError(
                f"{where}.{key} is not a policy setting (known: {', '.join(sorted(POLICY_KEYS))})",
                field=f"policies.{name}.{key}",
            )
    weighers = []
    for i, item in enumerate(_list(table.get("weighers", []), f"{where}.weighers")):
        at = f"{where}.weighers[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValidationError(f"{at} must be a table with a name", field=at)
        multiplier = item.get("multiplier", 1.0)
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
            raise ValidationError(f"{at}.multiplier must be a number", field=f"{at}.multiplier")
        options = item.get("options", {})
        if not isinstance(options, dict) or set(item) - {"name", "multiplier", "options"}:
            raise ValidationError(f"{at}: only name, multiplier and options", field=at)
        weighers.append(WeigherSetting(item["name"], float(multiplier), options))
    sample = table.get("sample")
    if sample is not None and (
        isinstance(sample, bool) or not isinstance(sample, int) or sample < 1
    ):
        raise ValidationError(f"{where}.sample must be a positive integer", field=f"{where}.sample")
    filters = table.get("filters")
    return Policy(
        name,
        str(table.get("description", "")),
        tuple(weighers),
        sample=sample,
        disabled_filters=tuple(
            _names(table.get("disabled_filters", []), f"{where}.disabled_filters")
        ),
        filters=None if filters is None else tuple(_names(filters, f"{where}.filters")),
    )


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValidationError(f"{where} must be a list", field=where)
    return value


def _names(value: Any, where: str) -> list[str]:
    names = _list(value, where)
    if not all(isinstance(n, str) and n for n in names):
        raise ValidationError(f"{where} must be a list of names", field=where)
    return names
