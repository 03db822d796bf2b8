"""Time one full agent cycle (collect + evaluate the shipped policies + control).

Usage: .venv/bin/python bench/agent_cycle.py [--guests 500] [--repeats 30]
The host is a SimulatedHypervisor with a tier mix, warmed up until the sample history is
full, then timed while guest demand rises through memory pressure, so balloon, KSM,
migration and stop controls are applied; simulated time advances between cycles (not
timed). Prints the median and 95th percentile time per cycle, measured in this run.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from loadmaster.agent.hypervisor.simulated import SimulatedHypervisor
from loadmaster.agent.sla.simulated import simulated_agent
from loadmaster.policy import shipped_policy_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--guests", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    sim = SimulatedHypervisor.mixed(args.guests, seed=args.seed, ramp_steps=80)
    agent = simulated_agent(
        sim,
        shipped_policy_dir(),
        migration_sender=lambda _uuid, _reason: None,
    )
    for _ in range(30):  # warm up: history fills, host nears pressure
        sim.advance()
        agent.run_cycle()

    times, actions = [], []
    for _ in range(args.repeats):
        sim.advance()
        started = time.perf_counter()
        report = agent.run_cycle()
        times.append(time.perf_counter() - started)
        actions.append(len(report.actions))
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    free = sim.host_stats()["mem_free"] or 0
    print(
        f"agent cycle, {args.guests} simulated guests, {args.repeats} cycles: "
        f"median {statistics.median(times) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms "
        f"(median {statistics.median(actions):.0f} actions per cycle, "
        f"host {100 * free / sim.host_memory_kib:.0f}% free)"
    )


if __name__ == "__main__":
    main()
