"""Time one policy cycle of the shipped policies on a host with many guests.

Usage: .venv/bin/python bench/policy_cycle.py [--guests 500] [--repeats 30]
Guests get a realistic mix of tiers, ten samples of history and one IO-tuned disk each;
the host is under memory pressure so every rule does its full work. Prints the median
and 95th percentile time per cycle, measured in this run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from loadmaster.policy import load_policy_dir, shipped_policy_dir
from loadmaster.policy.snapshot import EntitySnapshot

TAGS = [(), ("platinum",), ("gold",), ("silver",), ("best-effort",), ("compute",)]
IO_MAX = {
    "total_bytes_sec": 10_485_760,
    "read_bytes_sec": 0,
    "write_bytes_sec": 0,
    "total_iops_sec": 500,
    "read_iops_sec": 0,
    "write_iops_sec": 0,
}


def make_guests(count: int, rng: random.Random) -> list[EntitySnapshot]:
    guests = []
    for i in range(count):
        size = rng.choice([2, 4, 8, 16]) * 1024 * 1024
        stats = {
            "balloon_cur": size,
            "balloon_max": size,
            "balloon_min": size // 4,
            "mem_unused": rng.randint(0, size // 2),
            "vcpu_user_limit": rng.choice([25, 50, 100]),
            "vcpu_count": rng.choice([1, 2, 4]),
            "vcpu_quota": -1,
            "vcpu_period": 100_000,
        }
        older = [{"balloon_cur": size, "mem_unused": rng.randint(0, size // 2)} for _ in range(9)]
        history = (*older, stats)
        disk = {"name": "vda", "path": f"/dev/vm{i}/vda", "maximum": IO_MAX, "current": {}}
        guests.append(
            EntitySnapshot(
                f"vm-{i:04d}",
                stats,
                history,
                {"uuid": f"uuid-{i}", "io_tune": [disk]},
                frozenset(rng.choice(TAGS)),
            )
        )
    return guests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--guests", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    rng = random.Random(42)
    total = 1024 * 1024 * 1024
    host = EntitySnapshot(
        "host",
        {
            "mem_available": total,
            "mem_free": total // 10,
            "ksm_shareable": total // 2,
            "ksm_pages_shared": 0,
            "ksm_merge_across_nodes": 1,
            "ksm_pages_to_scan": 100,
            "cpu_count": 64,
        },
        tuple({"mem_free": total // 10} for _ in range(10)),
    )
    guests = make_guests(args.guests, rng)
    policy = load_policy_dir(shipped_policy_dir())
    policy.evaluate(host, guests)  # warm-up

    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = policy.evaluate(host, guests)
        times.append(time.perf_counter() - start)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    print(
        f"{args.guests} guests, {args.repeats} cycles: median {statistics.median(times) * 1000:.1f} ms, "
        f"p95 {p95 * 1000:.1f} ms per cycle; {len(result.guest_controls)} guests with controls"
    )


if __name__ == "__main__":
    main()
