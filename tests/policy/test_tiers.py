"""The tier and priority definition, and how a policy reads it from an entity's tags."""

from __future__ import annotations

import pytest
from policy_helpers import guest, value_of

from loadmaster.tiers import (
    DEFAULT_PRIORITY,
    TIER_NAMES,
    UNTIERED,
    parse_priority,
    priority_of,
    tier_of,
    tiers_in,
)


def test_the_design_names_and_guarantees() -> None:
    assert TIER_NAMES == ("platinum", "gold", "silver", "compute", "vapor")
    assert tier_of(["platinum"]).memory_guarantee == 1.0
    assert tier_of(["gold"]).memory_guarantee == 0.75
    assert tier_of(["compute"]).keeps_cpu and not tier_of(["gold"]).keeps_cpu
    assert tier_of(["vapor"]).stoppable and not tier_of(["silver"]).stoppable


def test_best_effort_is_vapor_and_the_strongest_tier_wins() -> None:
    assert tier_of(["best-effort"]) is tier_of(["vapor"])
    assert tiers_in(["best-effort", "vapor"]) == [tier_of(["vapor"])]
    assert tier_of(["vapor", "compute", "gold", "web"]).name == "gold"
    assert tier_of(["web"]) is UNTIERED


@pytest.mark.parametrize(
    ("tag", "value"),
    [("priority:0", 0), ("priority:7", 7), ("priority:999", 999), ("gold", None), ("prio:1", None)],
)
def test_priority_tags(tag: str, value: int | None) -> None:
    assert parse_priority(tag) == value


@pytest.mark.parametrize(
    "tag",
    ["priority:", "priority:-1", "priority:+3", "priority:1000", "priority:1.5", "priority:٣"],
)
def test_malformed_priorities_are_refused_by_the_parser(tag: str) -> None:
    with pytest.raises(ValueError, match="priority:N"):
        parse_priority(tag)


def test_priority_of_ignores_malformed_tags_and_defaults_to_zero() -> None:
    assert priority_of(["gold"]) == DEFAULT_PRIORITY == 0
    assert priority_of(["priority:x", "priority:4"]) == 4
    assert priority_of(["priority:2", "priority:5"]) == 5


def test_policy_entities_expose_tier_priority_and_guarantee() -> None:
    vms = [
        guest("a", tags=["best-effort", "priority:3"]),
        guest("b", tags=["gold"]),
        guest("c", tags=["web"]),
    ]
    assert value_of("(with Guests g (g.Tier))", guests=vms) == ["vapor", "gold", "none"]
    assert value_of("(with Guests g (g.Priority))", guests=vms) == [3, 0, 0]
    assert value_of("(with Guests g (g.MemoryGuarantee))", guests=vms) == [0.0, 0.75, 0.0]
