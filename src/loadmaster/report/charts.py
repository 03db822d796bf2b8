"""The demo report's charts: matplotlib (Agg, no display) to base64 PNG for inline use."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence

import matplotlib

# No display on servers and in CI; chosen before pyplot is imported.
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

ACTIVE = "#2b6cb0"
PENDING = "#f6ad55"
BEFORE = "#9b2c2c"

# host -> (capacity, active, pending) of one resource class
Usage = Mapping[str, tuple[int, int, int]]


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def utilisation(
    hosts: Sequence[str], before: Mapping[str, Usage], after: Mapping[str, Usage]
) -> str:
    """One panel per class: after the mass start as stacked active + pending bars per
    host, before as a line; hosts ordered by their final utilisation."""
    classes = list(after)
    figure, axes = plt.subplots(len(classes), 1, figsize=(12, 3.2 * len(classes)), squeeze=False)
    for ax, name in zip(axes[:, 0], classes, strict=True):
        cap = np.array([max(after[name].get(h, (0, 0, 0))[0], 1) for h in hosts], float)
        active = np.array([after[name].get(h, (0, 0, 0))[1] for h in hosts]) / cap * 100
        pending = np.array([after[name].get(h, (0, 0, 0))[2] for h in hosts]) / cap * 100
        prior = np.array([sum(before[name].get(h, (0, 0, 0))[1:]) for h in hosts]) / cap * 100
        order = np.argsort(-(active + pending), kind="stable")
        x = np.arange(len(hosts))
        ax.bar(x, active[order], width=1.0, color=ACTIVE, label="active (after)")
        ax.bar(
            x,
            pending[order],
            width=1.0,
            bottom=active[order],
            color=PENDING,
            label="pending (after)",
        )
        ax.step(x, prior[order], where="mid", color=BEFORE, linewidth=1.2, label="used before")
        ax.set_xlim(-0.5, len(hosts) - 0.5)
        ax.set_ylim(0, 105)
        ax.set_ylabel(f"{name} used %")
        ax.set_xlabel(f"{len(hosts)} hosts, fullest first")
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    figure.suptitle("Utilisation per host: before and after the mass start")
    return _png(figure)


def placement_times(decision_ms: Sequence[float]) -> str:
    figure, ax = plt.subplots(figsize=(6, 3.4))
    values = np.array(decision_ms, float)
    if len(values):
        low, high = max(values.min(), 1e-3), max(values.max(), 1e-2)
        bins = np.logspace(np.log10(low), np.log10(high * 1.01), 40)
        ax.hist(values, bins=list(bins), color=ACTIVE)
        ax.set_xscale("log")
        # Plain numbers: log-scale minor labels like "3x10^-2" pile up unreadably.
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        for q, style in ((50, "--"), (99, ":")):
            ax.axvline(np.percentile(values, q), color=BEFORE, linestyle=style, label=f"p{q}")
        ax.legend(fontsize=8)
    ax.set_xlabel("decision time per VM (ms, log scale)")
    ax.set_ylabel("VMs")
    ax.set_title("Placement time")
    return _png(figure)


def timeline(points: Sequence[tuple[float, int, int]]) -> str:
    """``(elapsed seconds, placed so far, failed so far)`` after each batch."""
    figure, ax = plt.subplots(figsize=(6, 3.4))
    if points:
        seconds = [0.0, *(p[0] for p in points)]
        ax.plot(seconds, [0, *(p[1] for p in points)], color=ACTIVE, marker=".", label="placed")
        ax.plot(seconds, [0, *(p[2] for p in points)], color=BEFORE, marker=".", label="no host")
        ax.legend(fontsize=8)
    ax.set_xlabel("seconds since the mass start began")
    ax.set_ylabel("VMs")
    ax.set_title("Mass start timeline (schedule + pending claim)")
    ax.grid(alpha=0.3)
    return _png(figure)
