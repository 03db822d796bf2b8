"""The demo report's charts: matplotlib (Agg, no display) to base64 PNG for inline use."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence

import matplotlib

# No display on servers and in CI; chosen before pyplot is imported.
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

# One colour per VM state, the same in every chart and in the test that reads the pixels.
STATE_COLOURS = {
    "requested": "#a0aec0",
    "pending": "#f6ad55",
    "running": "#2b6cb0",
    "migrating": "#d53f8c",
    "stopped": "#4a5568",
}
TIER_COLOURS = {
    "platinum": "#805ad5",
    "gold": "#d69e2e",
    "silver": "#718096",
    "compute": "#38a169",
    "vapor": "#e53e3e",
    "none": "#a0aec0",
}
PHASE_SHADES = ("#ebf8ff", "#fffaf0", "#f0fff4", "#fff5f7")

Phases = Sequence[tuple[str, float, float]]


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _phases(ax: Axes, phases: Phases) -> None:
    for i, (name, start, end) in enumerate(phases):
        ax.axvspan(start, end, color=PHASE_SHADES[i % len(PHASE_SHADES)], zorder=0)
        ax.text(start, 1.0, f" {name}", transform=ax.get_xaxis_transform(), va="top", fontsize=8)


def vm_states(times: Sequence[float], counts: Mapping[str, Sequence[int]], phases: Phases) -> str:
    """Stacked VM counts by state over time, phases shaded behind."""
    figure, ax = plt.subplots(figsize=(12, 3.8))
    _phases(ax, phases)
    shown = [s for s in STATE_COLOURS if any(counts.get(s, ()))]
    ax.stackplot(
        times,
        [counts[s] for s in shown],
        labels=shown,
        colors=[STATE_COLOURS[s] for s in shown],
        zorder=2,
    )
    ax.set_xlabel("seconds since the mass start")
    ax.set_ylabel("VMs")
    ax.set_xlim(times[0] if times else 0, times[-1] if times else 1)
    ax.legend(loc="center right", fontsize=8)
    ax.set_title("VM states: placed (pending), launched by the agents (running), moved")
    return _png(figure)


def tier_memory(
    times: Sequence[float],
    minimum: Mapping[str, Sequence[float]],
    guarantees: Mapping[str, float],
    phases: Phases,
) -> str:
    """Per tier, the smallest share of its memory any running guest keeps, against the
    tier's guarantee (dashed)."""
    figure, ax = plt.subplots(figsize=(12, 3.8))
    _phases(ax, phases)
    for tier, values in minimum.items():
        colour = TIER_COLOURS.get(tier, "#000000")
        ax.plot(times, [v * 100 for v in values], color=colour, label=tier, zorder=3)
        if guarantees.get(tier):
            ax.axhline(guarantees[tier] * 100, color=colour, linestyle="--", linewidth=1, zorder=2)
    ax.set_ylim(0, 105)
    ax.set_xlabel("seconds since the mass start")
    ax.set_ylabel("memory kept, % (lowest guest)")
    ax.legend(loc="lower left", fontsize=8, ncol=len(minimum))
    ax.set_title("Memory each tier keeps under pressure; dashed: its guarantee")
    return _png(figure)


def host_memory(times: Sequence[float], used: Mapping[str, Sequence[float]], phases: Phases) -> str:
    """Each host's resident memory against its physical memory (100 %)."""
    figure, ax = plt.subplots(figsize=(12, 3.4))
    _phases(ax, phases)
    for host, values in sorted(used.items()):
        ax.plot(times, [v * 100 for v in values], linewidth=1, label=host, zorder=3)
    ax.axhline(100, color="#9b2c2c", linewidth=1.2, zorder=2)
    ax.set_xlabel("seconds since the mass start")
    ax.set_ylabel("host memory used %")
    ax.set_title("Host memory in use (100 % = physical; beyond it the host would swap)")
    ax.legend(loc="upper left", fontsize=7, ncol=6)
    return _png(figure)
