"""The main job with small sizes: it runs, prints what it promises, and its report
renders in headless Chromium with charts that are not blank."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

LOADMASTER = str(Path(sys.executable).parent / "loadmaster")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ACTIVE_BLUE = (0x2B, 0x6C, 0xB0)
PENDING_ORANGE = (0xF6, 0xAD, 0x55)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("demo")
    args = ["demo", "--hosts", "20", "--vms", "100", "--db", f"sqlite:///{directory / 'demo.db'}"]
    result = subprocess.run(
        [LOADMASTER, *args, "--out", str(directory / "report")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return directory / "report" / "index.html", result.stdout


def test_demo_prints_usage_split_and_an_explanation(report: tuple[Path, str]) -> None:
    _, output = report
    text = " ".join(output.split())
    assert "20 hosts" in text and "100 VMs requested" in text
    assert re.search(r"mass start: \d+ placed", text)
    assert "still pending" in text
    assert "active" in text and "pending" in text and "Fullest hosts" in text
    assert "no valid host gpu-giant (8 GPUs): no host fits: 20 hosts" in text
    assert "ledger audit: 0 problem(s)" in text


def test_report_is_self_contained_with_three_charts(report: tuple[Path, str]) -> None:
    page = report[0].read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 3
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    for encoded in images:
        pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(encoded))).convert("RGB"))
        assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20


def _count(pixels: np.ndarray, colour: tuple[int, int, int]) -> int:
    return int(np.all(np.abs(pixels.astype(int) - colour) <= 12, axis=-1).sum())


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed")
def test_report_renders_in_headless_chromium(report: tuple[Path, str], tmp_path: Path) -> None:
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
    # The utilisation chart sits in the upper part of the page: its bars must be drawn.
    chart_band = pixels[250:1000]
    not_white = np.any(chart_band < 240, axis=-1).mean()
    assert not_white > 0.05
    assert _count(chart_band, ACTIVE_BLUE) > 2000
    assert _count(chart_band, PENDING_ORANGE) > 20
    assert len(np.unique(chart_band.reshape(-1, 3), axis=0)) > 100
    # Histogram and timeline further down.
    assert _count(pixels[1000:1400], ACTIVE_BLUE) > 500
