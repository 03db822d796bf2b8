"""``simulate-host``: the console and the HTML page give the same figures in one unit, and
the plot shows the stops, the migration requests and the swap inside guests."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np
from PIL import Image
from typer.testing import CliRunner

from loadmaster.cli import app
from loadmaster.demo.simulation import GUEST_SWAP_COLOUR, MIGRATION_COLOUR, STOP_COLOUR


def _pixels(png: bytes, colour: str) -> int:
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    wanted = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return int(np.all(np.abs(rgb - wanted) <= 10, axis=-1).sum())


def test_console_and_page_agree_in_gib_and_the_plot_marks_events(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    run = CliRunner().invoke(
        app, ["simulate-host", "--guests", "20", "--steps", "90", "--seed", "4", "--out", str(out)]
    )
    assert run.exit_code == 0, run.output
    console = run.output
    page = (out / "simulation.html").read_text()
    assert "KiB" not in console and "KiB" not in page
    figures = re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", page)
    assert len(figures) > 8
    for label, value in figures:
        assert f"{label}: {value}".replace("&gt;", ">") in console.replace("\n", " ")
    assert any(value.endswith(" GiB") and value != "0.00 GiB" for _, value in figures)

    rows = list(csv.DictReader((out / "simulation.csv").open()))
    stops = sum(int(r["stops"]) for r in rows)
    asked = sum(int(r["migration_requests"]) for r in rows)
    assert f"vapor VMs stopped: {stops}" in console and stops > 0
    assert f"migration requests: {asked}" in console and asked > 0
    assert max(float(r["guest_swap_gib"]) for r in rows) > 0

    png = (out / "simulation.png").read_bytes()
    for colour in (STOP_COLOUR, MIGRATION_COLOUR, GUEST_SWAP_COLOUR):
        assert _pixels(png, colour) > 50, colour
