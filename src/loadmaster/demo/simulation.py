"""A host under rising memory pressure, with and without the shipped SLA policies.

Both runs use the same seed, so guests demand exactly the same memory; only the agent
differs. The figures show whether ballooning keeps the host out of swap while platinum
VMs keep their whole allocation.
"""

from __future__ import annotations

import csv
import html
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.sla.simulated import simulated_agent
from loadmaster.policy import shipped_policy_dir
from loadmaster.tiers import TIERS

# Colours of what the plot marks, distinct from every line, so a reader (and the test that
# reads the pixels) tells them apart.
STOP_COLOUR = "#e6194b"
MIGRATION_COLOUR = "#f58231"
GUEST_SWAP_COLOUR = "#911eb4"


@dataclass(frozen=True)
class SimulationResult:
    guests: int
    steps: int
    seed: int
    host_memory_kib: int
    max_swap_kib_with_policy: int
    max_swap_kib_without_policy: int
    min_platinum_balloon_ratio: float
    min_gold_balloon_ratio: float
    min_silver_balloon_ratio: float
    # Every tier's smallest balloon / allocation over the run (1.0 for a tier never seen).
    min_balloon_ratio: Mapping[str, float]
    max_guest_swap_kib: int
    stopped_guests: tuple[str, ...]
    migration_requests: int
    controller_failures: int
    csv_path: Path
    png_path: Path
    html_path: Path

    def figures(self) -> list[tuple[str, str]]:
        """The run in numbers, memory in GiB: the console and the HTML page print these."""
        return [
            ("guests / cycles / seed", f"{self.guests} / {self.steps} / {self.seed}"),
            ("host memory", _gib(self.host_memory_kib)),
            ("max host swap without policy", _gib(self.max_swap_kib_without_policy)),
            ("max host swap with SLA policy", _gib(self.max_swap_kib_with_policy)),
            *(
                (
                    f"smallest {t.name} balloon (guaranteed {t.memory_guarantee:.0%})",
                    f"{self.min_balloon_ratio[t.name]:.0%}",
                )
                for t in TIERS
            ),
            ("max swap inside guests", _gib(self.max_guest_swap_kib)),
            ("vapor VMs stopped", str(len(self.stopped_guests))),
            ("migration requests", str(self.migration_requests)),
        ]


def _gib(kib: float) -> str:
    return f"{kib / GIB:.2f} GiB"


def simulate_host(guests: int, steps: int, seed: int, out_dir: Path) -> SimulationResult:
    """Run ``steps`` agent cycles on ``guests`` simulated VMs; write CSV, PNG and HTML."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Demand peaks at two thirds of the run, so the end shows the host holding steady.
    ramp = max(1, steps * 2 // 3)
    with_policy = SimulatedHypervisor.mixed(guests, seed=seed, ramp_steps=ramp)
    without = SimulatedHypervisor.mixed(guests, seed=seed, ramp_steps=ramp)
    migrations: list[tuple[str, str]] = []
    agent = simulated_agent(
        with_policy,
        shipped_policy_dir(),
        interval=with_policy.step_seconds,
        host_name="simulated-host",
        migration_sender=lambda uuid, reason: migrations.append((uuid, reason)),
    )
    rows: list[dict[str, float]] = []
    min_ratio = {t.name: 1.0 for t in TIERS}
    max_guest_swap = failures = 0
    for step in range(1, steps + 1):
        # A stop the policy asks for takes effect as the guest shuts down, in a later
        # advance: counted over the whole step.
        stopped_before, asked_before = len(with_policy.stopped), len(migrations)
        with_policy.advance()
        without.advance()
        report = agent.run_cycle()
        failures += len(report.failures)
        ratios = with_policy.balloon_ratios()
        row: dict[str, float] = {
            "step": step,
            "time_s": with_policy.clock(),
            "host_memory_gib": with_policy.host_memory_kib / GIB,
            "host_used_gib": with_policy.host_used_kib / GIB,
            "host_swap_gib": with_policy.host_swap_kib / GIB,
            "host_swap_gib_no_policy": without.host_swap_kib / GIB,
            "host_used_gib_no_policy": without.host_used_kib / GIB,
            "guest_swap_gib": with_policy.guest_swap_kib() / GIB,
            "running_guests": len(with_policy.list_guests()),
            "actions": len(report.actions),
            "stops": len(with_policy.stopped) - stopped_before,
            "migration_requests": len(migrations) - asked_before,
        }
        for tier in TIERS:
            # NaN once a tier has no running VM left: a gap in the plot, not a full balloon.
            values = ratios.get(tier.name)
            row[f"{tier.name}_min_balloon"] = min(values) if values else math.nan
            if values:
                min_ratio[tier.name] = min(min_ratio[tier.name], *values)
        max_guest_swap = max(max_guest_swap, with_policy.guest_swap_kib())
        rows.append(row)

    csv_path, png_path, html_path = (
        out_dir / "simulation.csv",
        out_dir / "simulation.png",
        out_dir / "simulation.html",
    )
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["step"])
        writer.writeheader()
        writer.writerows(rows)
    result = SimulationResult(
        guests=guests,
        steps=steps,
        seed=seed,
        host_memory_kib=with_policy.host_memory_kib,
        max_swap_kib_with_policy=int(max((r["host_swap_gib"] for r in rows), default=0) * GIB),
        max_swap_kib_without_policy=int(
            max((r["host_swap_gib_no_policy"] for r in rows), default=0) * GIB
        ),
        min_platinum_balloon_ratio=min_ratio["platinum"],
        min_gold_balloon_ratio=min_ratio["gold"],
        min_silver_balloon_ratio=min_ratio["silver"],
        min_balloon_ratio=min_ratio,
        max_guest_swap_kib=max_guest_swap,
        stopped_guests=tuple(with_policy.stopped),
        migration_requests=len(migrations),
        controller_failures=failures,
        csv_path=csv_path,
        png_path=png_path,
        html_path=html_path,
    )
    _plot(rows, png_path)
    _write_html(result, html_path)
    return result


def _plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (mem, balloons) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    mem.plot(steps, [r["host_memory_gib"] for r in rows], "k--", label="host memory")
    mem.plot(steps, [r["host_used_gib_no_policy"] for r in rows], "r:", label="used, no policy")
    mem.plot(steps, [r["host_used_gib"] for r in rows], "b-", label="used, SLA policy")
    mem.fill_between(
        steps,
        [r["host_swap_gib_no_policy"] for r in rows],
        color="r",
        alpha=0.3,
        label="host swap, no policy",
    )
    mem.fill_between(
        steps,
        [r["host_swap_gib"] for r in rows],
        color="b",
        alpha=0.5,
        label="host swap, SLA policy",
    )
    mem.plot(
        steps,
        [r["guest_swap_gib"] for r in rows],
        color=GUEST_SWAP_COLOUR,
        linewidth=2,
        label="swap inside guests, SLA policy",
    )
    for column, colour, marker, label in (
        ("stops", STOP_COLOUR, "v", "vapor VM stopped"),
        ("migration_requests", MIGRATION_COLOUR, "^", "migration requested"),
    ):
        marked = [r["step"] for r in rows if r[column]]
        for step in marked:
            mem.axvline(step, color=colour, linewidth=0.8, alpha=0.6)
        mem.scatter(
            marked,
            [r["host_memory_gib"] for r in rows if r[column]],
            color=colour,
            marker=marker,
            s=60,
            zorder=3,
            label=f"{label} ({sum(int(r[column]) for r in rows)})",
        )
    mem.set_ylabel("GiB")
    mem.set_title("Host memory under rising guest demand")
    mem.legend(loc="upper left", fontsize="small")
    for tier, color in zip(TIERS, ("g", "y", "c", "b", "m"), strict=True):
        balloons.plot(
            steps, [r[f"{tier.name}_min_balloon"] for r in rows], f"{color}-", label=tier.name
        )
        if tier.memory_guarantee > 0:
            # The guarantee the line must stay on or above.
            balloons.axhline(tier.memory_guarantee, color=color, linestyle=":", linewidth=0.8)
    balloons.set_ylim(0, 1.05)
    balloons.set_ylabel("smallest balloon / allocation")
    balloons.set_xlabel("agent cycle")
    balloons.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _write_html(result: SimulationResult, path: Path) -> None:
    rows = "\n".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in result.figures()
    )
    path.write_text(
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        "<title>loadmaster host simulation</title></head><body>\n"
        "<h1>Host under rising memory pressure</h1>\n"
        f"<table>\n{rows}\n</table>\n"
        f"<p><img src='{html.escape(result.png_path.name)}' alt='memory and balloons per cycle'></p>\n"
        f"<p>Data: <a href='{html.escape(result.csv_path.name)}'>{html.escape(result.csv_path.name)}</a></p>\n"
        "</body></html>\n"
    )
