"""Placement's rules on a provider's traits (``required``) and aggregates (``member_of``),
as parsed from a query string: pure values that judge a set of names."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass


@dataclass(frozen=True)
class MemberOf:
    """``any_of``: each set must share an aggregate with the provider; ``none_of``: the
    provider must be in none of these."""

    any_of: tuple[frozenset[str], ...] = ()
    none_of: frozenset[str] = frozenset()

    def admits(self, aggregates: Set[str]) -> bool:
        return self.within(aggregates) and self.outside(aggregates)

    def within(self, aggregates: Set[str]) -> bool:
        """The positive half: every ``any_of`` set met."""
        return all(aggregates & wanted for wanted in self.any_of)

    def outside(self, aggregates: Set[str]) -> bool:
        """The negative half: in none of ``none_of``."""
        return not aggregates & self.none_of


@dataclass(frozen=True)
class Required:
    """``all_of``: traits the provider must have; ``any_of``: of each set, at least one;
    ``none_of``: traits it must not have."""

    all_of: frozenset[str] = frozenset()
    any_of: tuple[frozenset[str], ...] = ()
    none_of: frozenset[str] = frozenset()

    def names(self) -> set[str]:
        return set(self.all_of | self.none_of).union(*self.any_of)

    def admits(self, traits: Set[str]) -> bool:
        return (
            self.all_of <= traits
            and all(traits & wanted for wanted in self.any_of)
            and not traits & self.none_of
        )
