"""The scheduler's policies by name, each loaded once into the filters and weighers it
runs, as kube-scheduler builds each profile's plugins once from its configuration."""

from __future__ import annotations

from collections.abc import Mapping

from loadmaster.errors import ValidationError
from loadmaster.scheduler.core.decide import LoadedPolicy
from loadmaster.scheduler.core.plugins import LoadedFilter, load_filters, load_weighers
from loadmaster.scheduler.core.policies import DEFAULT_POLICY, POLICIES, Policy


class PolicyRegistry:
    """The built-in policies and the operator's (``policies``), ``default`` among them.
    Every loaded policy draws among the ``subset_size`` best hosts within
    ``tie_tolerance`` of the best (see ``Scheduler``)."""

    def __init__(
        self,
        policies: Mapping[str, Policy] | None,
        default: str | None,
        *,
        subset_size: int,
        tie_tolerance: float,
    ) -> None:
        self._subset_size, self._tie_tolerance = subset_size, tie_tolerance
        self._filters: list[LoadedFilter] | None = None
        self._loaded: dict[str, LoadedPolicy] = {}
        self.policies: dict[str, Policy] = {**POLICIES, **(policies or {})}
        self.default = self.named(default or DEFAULT_POLICY, "default_policy").name

    def named(self, name: str, field: str) -> Policy:
        """The policy called ``name``; else a refusal naming ``field``."""
        if name not in self.policies:
            raise ValidationError(
                f"{field} {name!r} is not a policy (known: {', '.join(sorted(self.policies))})",
                field=field,
            )
        return self.policies[name]

    def loaded(self, policy: Policy) -> LoadedPolicy:
        if policy.name not in self._loaded:
            self._loaded[policy.name] = self._load(policy)
        return self._loaded[policy.name]

    def follow(self, other: PolicyRegistry) -> None:
        """Hold ``other``'s policies and default (each registry loads its own plugins)."""
        self.policies, self.default = other.policies, other.default

    def replace(self, policies: Mapping[str, Policy]) -> None:
        """Replace the operator's policies (the built-in ones stay): each is loaded as a
        call would load it, and the default must remain, else nothing changes."""
        fresh = {**POLICIES, **policies}
        if self.default not in fresh:
            raise ValidationError(
                f"the default policy {self.default!r} is not in the new policies "
                f"(known: {', '.join(sorted(fresh))})",
                field="default_policy",
            )
        loaded = {policy.name: self._load(policy) for policy in fresh.values()}
        self._loaded, self.policies = loaded, fresh

    def _load(self, policy: Policy) -> LoadedPolicy:
        filters = self._loaded_filters()
        known = {f.name for f in filters}
        for verb, named in (("disables", policy.disabled_filters), ("runs", policy.filters)):
            unknown = sorted(set(named or ()) - known)
            if unknown:
                raise ValidationError(
                    f"policy {policy.name!r} {verb} filter {unknown[0]!r}, which is not "
                    f"registered (known: {', '.join(sorted(known))})",
                    field="policy",
                )
        runs = known if policy.filters is None else set(policy.filters)
        return LoadedPolicy(
            policy.name,
            tuple(f for f in filters if f.name in runs - set(policy.disabled_filters)),
            tuple(load_weighers(policy.weighers)),
            policy.sample,
            self._subset_size,
            self._tie_tolerance,
        )

    def _loaded_filters(self) -> list[LoadedFilter]:
        if self._filters is None:
            self._filters = load_filters()
        return self._filters
