"""Where in a provider tree a claim's amounts go: the one rule the ledger writes records
by and the scheduler's snapshot predicts them by, so the two can never disagree.

A tree is its root host first, then its child providers (NUMA nodes, devices) in id order.
A NUMA node is a child of the root offering CPUs or memory (``NODE_CLASSES``); a device
provider is under the node its device is attached to, or under the root when the host has
no NUMA nodes or the device no NUMA information.

Each class goes whole on the first provider of the tree that can hold it. With
``one_node`` (``hw:numa_nodes=1``) the classes the NUMA nodes offer all go to the first
node with room for every one of them, and only the rest follow the first rule; with an
``affinity`` (``hw:pci_numa_affinity_policy``) the rest are devices judged against that
node in the same search: ``required`` takes only the node's own devices (and the root's
classes), ``legacy`` also devices under no node, ``preferred`` the node's first and then
any; the first node with room for everything wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

P = TypeVar("P")
NODE_CLASSES = ("VCPU", "PCPU", "MEMORY_MB")
Affinity = Literal["required", "legacy", "preferred"]
AFFINITIES: tuple[Affinity, ...] = ("required", "legacy", "preferred")


@dataclass(frozen=True)
class Misfit:
    """Why the amounts do not fit. ``resource_class``: the class that found no provider
    (None when the one-node rule failed); ``missing``: no provider of the tree offers it;
    ``problems``: why the providers tried could not hold it (the last one's for a class,
    one per node for the one-node rule)."""

    resource_class: str | None
    missing: bool
    problems: tuple[str, ...]


@dataclass(frozen=True)
class TreeFit(Generic[P]):
    plan: tuple[tuple[P, str, int], ...] = ()
    misfit: Misfit | None = None


def numa_nodes(
    parents: Sequence[int | None], offers_cpu_or_memory: Sequence[bool]
) -> list[int | None]:
    """Per provider of a tree (root first; ``parents``: each one's parent's index in the
    tree, None for the root), the index of the NUMA node it belongs to: a node itself, a
    provider under a node that node, the root and what is under no node None."""
    node = [
        i if i and parents[i] == 0 and offers_cpu_or_memory[i] else None
        for i in range(len(parents))
    ]
    out: list[int | None] = []
    for i in range(len(parents)):
        at: int | None = i
        while at is not None and node[at] is None:
            at = parents[at]
        out.append(None if at is None else node[at])
    return out


def fit_in_tree(
    providers: Sequence[P],
    amounts: Mapping[str, int],
    *,
    one_node: bool,
    offers: Callable[[P, str], bool],
    problem: Callable[[P, str, int], str],
    node_of: Sequence[int | None] | None = None,
    affinity: Affinity | None = None,
) -> TreeFit[P]:
    """``offers(provider, class)``: the provider has an inventory of the class;
    ``problem(provider, class, amount)``: why it cannot hold the amount now ("" if it can);
    ``node_of``: ``numa_nodes`` of the tree (default: every child is a node).
    Classes are placed in name order, so the outcome never depends on dict order."""
    if node_of is None:
        node_of = [None, *range(1, len(providers))]
    nodes = [i for i in range(1, len(providers)) if node_of[i] == i]
    if not (one_node and nodes):
        return _each_whole(providers, amounts, range(len(providers)), offers, problem)
    on_nodes = sorted(
        (name, amount)
        for name, amount in amounts.items()
        if any(offers(providers[i], name) for i in nodes)
    )
    if not on_nodes:
        return _each_whole(providers, amounts, range(len(providers)), offers, problem)
    rest = {name: amount for name, amount in amounts.items() if name not in dict(on_nodes)}
    problems: list[str] = []
    first_misfit: Misfit | None = None
    for i in nodes:
        node = providers[i]
        found = [problem(node, name, amount) for name, amount in on_nodes]
        if any(found):
            problems.append(next(p for p in found if p))
            continue
        order = _affine(node_of, i, affinity)
        fit = _each_whole(providers, rest, order, offers, problem)
        if fit.misfit is None:
            return TreeFit(tuple((node, name, amount) for name, amount in on_nodes) + fit.plan)
        if affinity is None:
            return fit  # the rest goes where it goes whichever node is chosen
        first_misfit = first_misfit or fit.misfit
        problems.append(
            f"{fit.misfit.resource_class}: none with room on NUMA node "
            f"{getattr(node, 'name', i)} ({affinity})"
        )
    if (
        first_misfit is not None
        and first_misfit.resource_class is not None
        and not any(offers(p, first_misfit.resource_class) for p in providers)
    ):
        return TreeFit(misfit=first_misfit)  # the tree has none of it, on any node
    return TreeFit(misfit=Misfit(None, False, tuple(problems)))


def _affine(node_of: Sequence[int | None], node: int, affinity: Affinity | None) -> list[int]:
    """The providers (indices) a VM on ``node`` may take its other classes from, in the
    order tried: the root always; then as ``affinity`` says."""
    everything = list(range(len(node_of)))
    if affinity is None:
        return everything
    own = [i for i in everything if i == 0 or node_of[i] == node]
    if affinity == "required":
        return own
    if affinity == "legacy":
        return [i for i in everything if i == 0 or node_of[i] in (node, None)]
    return own + [i for i in everything if i not in own]


def _each_whole(
    providers: Sequence[P],
    amounts: Mapping[str, int],
    order: Sequence[int] | range,
    offers: Callable[[P, str], bool],
    problem: Callable[[P, str, int], str],
) -> TreeFit[P]:
    """Each class whole on the first provider of ``order`` that can hold it."""
    plan: list[tuple[P, str, int]] = []
    for name, amount in sorted(amounts.items()):
        offering = [providers[i] for i in order if offers(providers[i], name)]
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
