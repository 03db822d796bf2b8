"""The main job with small sizes: the whole loop runs (agents launch, the policy moves
VMs under pressure, a host is drained), it prints what it promises, and its report
renders in headless Chromium with charts that show what happened."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from loadmaster.report.charts import STATE_COLOURS, TIER_COLOURS

LOADMASTER = str(Path(sys.executable).parent / "loadmaster")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _rgb(colour: str) -> tuple[int, int, int]:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def _count(pixels: np.ndarray, colour: str) -> int:
    return int(np.all(np.abs(pixels.astype(int) - _rgb(colour)) <= 12, axis=-1).sum())


DEMO_ARGS = ["demo", "--hosts", "6", "--vms", "60", "--cycle", "0.25", "--ramp", "12"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return _run_demo(tmp_path_factory.mktemp("demo"), DEMO_ARGS)


def _run_demo(directory: Path, args: list[str]) -> tuple[Path, str]:
    result = subprocess.run(
        [LOADMASTER, *args, "--db", f"sqlite:///{directory / 'demo.db'}", "--out", str(directory)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return directory / "index.html", " ".join(result.stdout.split())


def test_demo_runs_the_whole_loop(report: tuple[Path, str]) -> None:
    _, text = report
    assert "6 hosts registered by their agents, 60 VMs requested" in text
    assert re.search(r"mass start: 60 VMs up in [\d.]+ s", text), text
    moved = re.search(r"memory pressure: (\d+) migration requests .*?, (\d+) VMs moved", text)
    assert moved and int(moved.group(2)) > 0, text
    drained = re.search(
        r"drain of (host-\d+): (\d+) VMs moved .*?, (\d+) fit nowhere \(stopped: (\d+)\); "
        r"host maintenance",
        text,
    )
    assert drained and int(drained.group(2)) > 0, text
    # Whatever fit nowhere is explained, then stopped so that the host empties.
    assert drained.group(3) == drained.group(4)
    assert text.count("fits nowhere:") == int(drained.group(3))
    assert "no valid host giant-1 (512 GiB)" in text and "short of MEMORY_MB" in text
    assert "group-rule violations: 0 at any sampled moment, 0 at the end" in text
    assert "ledger audit: 0 problem(s)" in text


def test_one_seed_places_the_mass_start_the_same_way_on_every_run(
    report: tuple[Path, str], tmp_path: Path
) -> None:
    first = json.loads((report[0].parent / "mass-start.json").read_text())
    again, _ = _run_demo(tmp_path, DEMO_ARGS)
    second = json.loads((again.parent / "mass-start.json").read_text())
    assert first["seed"] == second["seed"] == 7
    assert len(first["placements"]) == 60
    assert first == second


def test_report_is_self_contained_and_its_charts_show_the_story(
    report: tuple[Path, str],
) -> None:
    page = report[0].read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 3
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    charts = [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(i))).convert("RGB")) for i in images
    ]
    states, tiers, _hosts = charts
    assert _count(states, STATE_COLOURS["running"]) > 5000
    assert _count(states, STATE_COLOURS["pending"]) > 100
    assert _count(states, STATE_COLOURS["migrating"]) > 10
    for tier in ("platinum", "gold", "vapor"):
        assert _count(tiers, TIER_COLOURS[tier]) > 50, tier
    assert "drain" in page and "policy" in page  # both kinds of migration are listed


def test_report_renders_in_headless_chromium(report: tuple[Path, str], tmp_path: Path) -> None:
    assert Path(CHROMIUM).exists(), "scripts/setup.sh installs Debian's chromium"
    screenshot = tmp_path / "report.png"
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={screenshot}",
            "--window-size=1280,2000",
            report[0].resolve().as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert screenshot.exists() and screenshot.stat().st_size > 10_000
    pixels = np.asarray(Image.open(screenshot).convert("RGB"))
    assert pixels.shape[:2] == (2000, 1280)
    # The states chart sits in the upper part of the page: its areas must be drawn.
    band = pixels[300:1000]
    assert np.any(band < 240, axis=-1).mean() > 0.05
    assert _count(band, STATE_COLOURS["running"]) > 2000
    assert len(np.unique(band.reshape(-1, 3), axis=0)) > 100
