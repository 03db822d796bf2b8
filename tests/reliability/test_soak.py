"""The short soak of bench/soak.py, as CI runs it: 4 API workers on a private PostgreSQL,
client processes starting, migrating, stopping and deleting VMs, simulated host agents
reporting what runs where, the database stopped for 3 s in the middle; every final check
of the harness must pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_under_a_database_outage(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/soak.py"),
            "--duration",
            "45",
            "--clients",
            "4",
            "--workers",
            "4",
            "--outage",
            "3",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    summary_file = tmp_path / "summary.json"
    assert summary_file.exists(), run.stderr[-3000:]
    summary = json.loads(summary_file.read_text())
    failed = [c for c in summary["checks"] if not c["ok"]]
    assert not failed, json.dumps(failed, indent=2)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # The soak proved something only if it did real work on both sides of the outage.
    assert summary["requests"] >= 500
    assert summary["unavailable_503"] > 0
    assert summary["first_ok_after_resume_s"] is not None
    assert summary["first_ok_after_resume_s"] < 10
    # The simulated host agents reported, and their reports ended claims of VMs that had
    # not started (never a running VM: a check above).
    assert summary["host_reports"] > 0 and summary["reconciled"].get("released", 0) > 0
    for op in ("create", "start", "up", "migrate", "stop", "delete", "report"):
        assert summary["latency_ms"][op]["count"] > 0, op
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
