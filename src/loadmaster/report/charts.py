"""The demo report's charts: matplotlib (Agg, no display) to SVG, inlined in the page.

The three charts share one layout: the same width, the same plot area and the same time
span, so that one moment lies at the same place across the page in all three. Legends
sit to the right of the plot area, never on the data. Elements carry ids (``CHART-plot-
area``, ``CHART-legend``, ``CHART-series-NAME``) so that the page can be checked as a
browser draws it."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import matplotlib

# No display on servers and in CI; chosen before pyplot is imported.
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.colors import hsv_to_rgb, to_hex
from matplotlib.figure import Figure

# One colour per VM state, the same in every chart and in the test that reads them.
STATE_COLOURS = {
    "requested": "#a0aec0",
    "pending": "#f6ad55",
    "running": "#2b6cb0",
    "migrating": "#d53f8c",
    "stopped": "#4a5568",
}
# Told apart by hue and by lightness: gold and silver once differed mostly in hue.
TIER_COLOURS = {
    "platinum": "#805ad5",
    "gold": "#d69e2e",
    "silver": "#2c5282",
    "compute": "#38a169",
    "vapor": "#e53e3e",
    "none": "#a0aec0",
}
PHASE_SHADES = ("#ebf8ff", "#fffaf0", "#f0fff4", "#fff5f7")
# Host memory above this share of the physical memory is the zone the chart exists to show.
PRESSURE_FROM = 80.0
WIDTH_IN = 12.0
# The plot area's left and right edges, as fractions of the figure: the same in every chart.
PLOT_LEFT, PLOT_RIGHT = 0.07, 0.80

Phases = Sequence[tuple[str, float, float]]
Span = tuple[float, float]


def distinct_colours(n: int) -> list[str]:
    """``n`` colours told apart by hue, and each from its neighbours by lightness too."""
    return [
        to_hex(tuple(hsv_to_rgb((i / max(n, 1), 0.9, 0.9 if i % 2 else 0.55)))) for i in range(n)
    ]


def _figure(name: str, height_in: float) -> tuple[Figure, Axes]:
    figure, ax = plt.subplots(figsize=(WIDTH_IN, height_in))
    figure.subplots_adjust(left=PLOT_LEFT, right=PLOT_RIGHT, top=0.9, bottom=0.16)
    ax.patch.set_gid(f"{name}-plot-area")
    return figure, ax


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    # No bbox_inches="tight": it would trim each chart differently and the time axes
    # would no longer line up.
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # inline: no XML prolog or DOCTYPE


def _frame(ax: Axes, name: str, span: Span, phases: Phases) -> None:
    """Phases shaded behind the data and named above the plot area; the shared time axis;
    the legend outside the plot area, to its right."""
    for i, (phase, start, end) in enumerate(phases):
        ax.axvspan(start, end, color=PHASE_SHADES[i % len(PHASE_SHADES)], zorder=0)
        ax.text(start, 1.01, phase, transform=ax.get_xaxis_transform(), va="bottom", fontsize=8)
    ax.set_xlim(*span)
    ax.set_xlabel("seconds since the demo began")
    handles, _labels = ax.get_legend_handles_labels()
    if handles:
        legend = ax.legend(
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            borderaxespad=0,
            fontsize=8,
            ncol=1 + (len(handles) - 1) // 16,
        )
        legend.set_gid(f"{name}-legend")


def vm_states(
    times: Sequence[float], counts: Mapping[str, Sequence[int]], span: Span, phases: Phases
) -> str:
    """Stacked VM counts by state over time, phases shaded behind."""
    figure, ax = _figure("states", 3.6)
    shown = [s for s in STATE_COLOURS if any(counts.get(s, ()))]
    if shown:  # matplotlib refuses a stack of nothing (a run without a sample)
        areas = ax.stackplot(
            times,
            [counts[s] for s in shown],
            labels=shown,
            colors=[STATE_COLOURS[s] for s in shown],
            zorder=2,
        )
        for state, area in zip(shown, areas, strict=True):
            area.set_gid(f"states-series-{state}")
    ax.set_ylabel("VMs")
    _frame(ax, "states", span, phases)
    return _svg(figure)


def tier_memory(
    times: Sequence[float],
    minimum: Mapping[str, Sequence[float]],
    guarantees: Mapping[str, float],
    span: Span,
    phases: Phases,
) -> str:
    """Per tier, the smallest share of its memory any running guest keeps, against the
    tier's guarantee (dashed)."""
    figure, ax = _figure("tiers", 3.6)
    for i, (tier, values) in enumerate(minimum.items()):
        colour = TIER_COLOURS.get(tier, "#000000")
        # Tiers often keep the same share (all of it): each line is drawn narrower than
        # the one beneath it, so one lying on another still shows as its edge.
        width = max(1.0, 4.5 - 0.8 * i)
        (line,) = ax.plot(
            times,
            [v * 100 for v in values],
            color=colour,
            label=tier,
            linewidth=width,
            zorder=3 + i,
        )
        line.set_gid(f"tiers-series-{tier}")
        if guarantees.get(tier):
            ax.axhline(guarantees[tier] * 100, color=colour, linestyle="--", linewidth=1, zorder=2)
    ax.set_ylim(0, 105)
    ax.set_ylabel("memory kept, % (lowest guest)")
    _frame(ax, "tiers", span, phases)
    return _svg(figure)


def host_memory(
    times: Sequence[float], used: Mapping[str, Sequence[float]], span: Span, phases: Phases
) -> str:
    """Each host's resident memory against its physical memory (100 %), each host its own
    colour; the pressure zone shaded."""
    figure, ax = _figure("hosts", 3.6)
    ax.axhspan(PRESSURE_FROM, 100, color="#fed7d7", zorder=1)
    ax.axhline(100, color="#9b2c2c", linewidth=1.2, zorder=2)
    hosts = sorted(used)
    for host, colour in zip(hosts, distinct_colours(len(hosts)), strict=True):
        (line,) = ax.plot(
            times, [v * 100 for v in used[host]], linewidth=1.2, color=colour, label=host, zorder=3
        )
        line.set_gid(f"hosts-series-{host}")
    ax.set_ylim(0, 110)
    ax.set_ylabel("host memory used %")
    _frame(ax, "hosts", span, phases)
    return _svg(figure)
