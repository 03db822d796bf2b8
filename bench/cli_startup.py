"""How long the ``loadmaster`` command takes to start: ``--help``, and ``host list``
against a live server (SQLite, 20 hosts), as a script calling it in a loop would see;
and ``vm show NAME`` among --vms VMs (the name is looked up by the server).

Usage: .venv/bin/python bench/cli_startup.py [--runs 15] [--vms 3000]
Prints the median wall time of each over --runs runs, with ``python -c pass`` measured in
the same run as the floor every Python command pays, and each figure's ratio to it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ServedApi


def median_seconds(command: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--vms", type=int, default=3000)
    args = parser.parse_args()
    loadmaster = shutil.which("loadmaster", path=str(Path(sys.executable).parent))
    if loadmaster is None:
        raise SystemExit("the loadmaster command is not installed next to this Python")
    with (
        tempfile.TemporaryDirectory() as directory,
        ServedApi(f"sqlite:///{directory}/lm.db", workers=1) as served,
    ):
        env = {**os.environ, "LOADMASTER_URL": served.url, "LOADMASTER_TOKEN": served.token}
        with served.client() as http:
            for i in range(20):
                body = {"name": f"b-{i}", "inventories": {"VCPU": {"total": 8}}}
                http.post("/hosts", json=body).raise_for_status()
            http.post(
                "/flavors", json={"name": "b.tiny", "resources": {"VCPU": 1}}
            ).raise_for_status()
            for i in range(args.vms):
                http.post("/vms", json={"name": f"vm-{i}", "flavor": "b.tiny"}).raise_for_status()
        last_vm = f"vm-{args.vms - 1}"
        figures = {
            "python -c pass": median_seconds([sys.executable, "-c", "pass"], args.runs, env),
            "loadmaster --help": median_seconds([loadmaster, "--help"], args.runs, env),
            "loadmaster host list": median_seconds([loadmaster, "host", "list"], args.runs, env),
            f"vm show ({args.vms} VMs)": median_seconds(
                [loadmaster, "vm", "show", last_vm], args.runs, env
            ),
        }
    floor = figures["python -c pass"]
    print(f"median of {args.runs} runs each")
    for name, seconds in figures.items():
        print(f"  {name:<22} {seconds * 1000:7.1f} ms  {seconds / floor:5.1f}x python -c pass")


if __name__ == "__main__":
    main()
