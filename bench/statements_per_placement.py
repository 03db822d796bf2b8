"""SQL statements per single placement (issue #11): what one ``schedule`` call of one VM runs.

Usage: .venv/bin/python bench/statements_per_placement.py [--hosts 200] [--vms 20]
       [--db URL] [--group] [--list]

Builds a small cluster (``bench/single_placement.py``'s host shape) in a temporary SQLite
file (or ``--db``, an empty database), places ``--vms`` VMs one per call and counts the
statements each call sends (SQLAlchemy's ``before_cursor_execute``, so transaction
control such as BEGIN/COMMIT sent by the driver itself is not counted, but SQLite's
``BEGIN IMMEDIATE``, sent as a statement, is). ``--group``: the VMs are members of one
anti-affinity group. ``--list``: print the statements of the last placement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import event

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from single_placement import FLAVOR, host_spec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--vms", type=int, default=20)
    parser.add_argument(
        "--db", default=None, help="an empty database's URL (default: a new SQLite file)"
    )
    parser.add_argument("--group", action="store_true")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()

    import loadmaster
    from loadmaster.cluster import VmSpec
    from loadmaster.scheduler import RequestSpec

    with tempfile.TemporaryDirectory() as tmp:
        lm = loadmaster.open(args.db or f"sqlite:///{tmp}/statements.db")
        if lm.hosts.list():
            lm.close()
            parser.error(f"--db: {args.db} holds hosts already; name an empty database")
        lm.resource_classes.create("CUSTOM_GPU", kind="accelerator", unit="gpu")
        lm.hosts.create_many([host_spec(i) for i in range(args.hosts)])
        lm.flavors.create({"name": "bench", "resources": FLAVOR})
        group = None
        if args.group:
            lm.groups.create("spread", "anti-affinity")
            group = "spread"
        lm.vms.create_many([VmSpec(f"vm-{i}", "bench", group=group) for i in range(args.vms)])
        uuids = [v.uuid for v in lm.vms.list() if v.state == "requested"]
        lm.scheduler.refresh()

        statements: list[str] = []

        @event.listens_for(lm.store.engine, "before_cursor_execute")
        def _count(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
            statements.append(" ".join(statement.split()))

        counts = []
        placed = 0
        for uuid in uuids:
            statements.clear()
            result = lm.scheduler.schedule([RequestSpec(vms=[uuid])])
            placed += len(result.placed)
            counts.append(len(statements))
        lm.close()
    print(
        f"{args.hosts} hosts, {len(uuids)} placements ({placed} placed)"
        f"{', one anti-affinity group' if args.group else ''}: statements per placement "
        f"median {statistics.median(counts)}, min {min(counts)}, max {max(counts)}"
    )
    if args.list:
        for n, statement in enumerate(statements, 1):
            print(f"{n:3d}  {statement[:220]}")


if __name__ == "__main__":
    main()
