"""Where in a provider tree a claim's amounts go: the one rule the ledger writes records
by and the scheduler's snapshot predicts them by, so the two can never disagree.

A tree is its root host first, then its child providers (NUMA nodes, PFs) in id order.
Each class goes whole on the first provider of the tree that can hold it. With
``one_node`` (``hw:numa_nodes=1``) the classes the child providers offer all go to the
first child with room for every one of them, and only the rest follow the first rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")


@dataclass(frozen=True)
class Misfit:
    """Why the amounts do not fit. ``resource_class``: the class that found no provider
    (None when the one-node rule failed); ``missing``: no provider of the tree offers it;
    ``problems``: why the providers tried could not hold it (the last one's for a class,
    one per child for the one-node rule)."""

    resource_class: str | None
    missing: bool
    problems: tuple[str, ...]


@dataclass(frozen=True)
class TreeFit(Generic[P]):
    plan: tuple[tuple[P, str, int], ...] = ()
    misfit: Misfit | None = None


def fit_in_tree(
    providers: Sequence[P],
    amounts: Mapping[str, int],
    *,
    one_node: bool,
    offers: Callable[[P, str], bool],
    problem: Callable[[P, str, int], str],
) -> TreeFit[P]:
    """``offers(provider, class)``: the provider has an inventory of the class;
    ``problem(provider, class, amount)``: why it cannot hold the amount now ("" if it can).
    Classes are placed in name order, so the outcome never depends on dict order."""
    plan: list[tuple[P, str, int]] = []
    rest = dict(amounts)
    nodes = providers[1:]
    if one_node and nodes:
        on_nodes = sorted(
            (name, amount)
            for name, amount in amounts.items()
            if any(offers(node, name) for node in nodes)
        )
        if on_nodes:
            problems = []
            for node in nodes:
                found = [problem(node, name, amount) for name, amount in on_nodes]
                if not any(found):
                    plan = [(node, name, amount) for name, amount in on_nodes]
                    break
                problems.append(next(p for p in found if p))
            else:
                return TreeFit(misfit=Misfit(None, False, tuple(problems)))
            rest = {name: amount for name, amount in amounts.items() if name not in dict(on_nodes)}
    for name, amount in sorted(rest.items()):
        offering = [p for p in providers if offers(p, name)]
        if not offering:
            return TreeFit(misfit=Misfit(name, True, ()))
        last = ""
        for provider in offering:
            last = problem(provider, name, amount)
            if not last:
                plan.append((provider, name, amount))
                break
        else:
            return TreeFit(misfit=Misfit(name, False, (last,)))
    return TreeFit(tuple(plan))
