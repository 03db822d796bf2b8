"""The report's tier-memory chart tells every tier apart, gold from silver too, even where
their lines lie on each other (both tiers keeping all their memory is the common case)."""

from __future__ import annotations

import itertools
import re

from loadmaster.report import charts


def _style(svg: str, tier: str) -> tuple[tuple[int, int, int], float]:
    found = re.search(rf'<g id="tiers-series-{tier}">\s*<path[^>]*style="([^"]*)"', svg)
    assert found is not None, tier
    style = dict(part.split(": ") for part in found.group(1).split("; "))
    colour = style["stroke"]
    rgb = (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))
    return rgb, float(style["stroke-width"])


def _lightness(rgb: tuple[int, int, int]) -> float:
    red, green, blue = rgb
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def test_tiers_differ_in_colour_and_lightness_and_coinciding_lines_both_show() -> None:
    tiers = ["platinum", "gold", "silver", "compute", "vapor"]
    kept = {tier: [1.0, 1.0, 1.0] for tier in tiers}
    guarantees = {"platinum": 1.0, "gold": 0.75, "silver": 0.5}
    svg = charts.tier_memory([0.0, 1.0, 2.0], kept, guarantees, (0.0, 2.0), [("run", 0.0, 2.0)])
    styles = {tier: _style(svg, tier) for tier in tiers}
    gold, silver = styles["gold"][0], styles["silver"][0]
    assert abs(_lightness(gold) - _lightness(silver)) > 60, (gold, silver)
    for (a, (rgb_a, _)), (b, (rgb_b, _)) in itertools.combinations(styles.items(), 2):
        assert sum((x - y) ** 2 for x, y in zip(rgb_a, rgb_b, strict=True)) ** 0.5 > 60, (a, b)
    # Each drawn narrower than the one beneath it: all five show where they coincide.
    widths = [styles[tier][1] for tier in tiers]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == len(widths), widths
