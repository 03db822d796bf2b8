"""The main job with small sizes: the whole loop runs (agents launch, the policy moves
VMs under pressure, a host is drained), it prints what it promises, its figures are the
ledger's, and its report renders in headless Chromium legibly: legends off the data,
distinct colours, one time axis, captions, tables whole in print, names not uuids."""

from __future__ import annotations

import contextlib
import html
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from PIL import Image

import loadmaster
from loadmaster.report.charts import STATE_COLOURS

if TYPE_CHECKING:
    from loadmaster.cluster.records import VmEvent

LOADMASTER = str(Path(sys.executable).parent / "loadmaster")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _rgb(colour: str) -> tuple[int, int, int]:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def _count(pixels: np.ndarray, colour: str) -> int:
    return int(np.all(np.abs(pixels.astype(int) - _rgb(colour)) <= 12, axis=-1).sum())


DEMO_ARGS = ["demo", "--hosts", "6", "--vms", "60", "--cycle", "0.25", "--ramp", "12"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return _run_demo(tmp_path_factory.mktemp("demo"), DEMO_ARGS)


def _run_demo(directory: Path, args: list[str]) -> tuple[Path, str]:
    """The report and what the demo printed, to a pipe (not a terminal) as a script sees it."""
    result = subprocess.run(
        [LOADMASTER, *args, "--db", f"sqlite:///{directory / 'demo.db'}", "--out", str(directory)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return directory / "index.html", result.stdout


def test_demo_runs_the_whole_loop(report: tuple[Path, str]) -> None:
    _, text = report
    assert "6 hosts registered by their agents, 60 VMs requested" in text
    started = re.search(
        r"mass start: (\d+) VMs up in [\d.]+ s .*; (?:no launch was refused|\d+ launches "
        r"refused by their hosts, \d+ of them placed again on another host, (\d+) not)$",
        text,
        re.M,
    )
    # A VM whose host refused its launch and that no other host took is not up, and the
    # line says so.
    assert started and int(started.group(1)) + int(started.group(2) or 0) == 60, text
    moved = re.search(r"memory pressure: (\d+) migration requests .*; (\d+) VMs moved", text)
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
    # A VM from an image with a NIC: what vm show says is what its host's agent gave the
    # hypervisor (flavor small: 20 GiB).
    booted = re.search(
        r"^from an image: boot-1 running on (host-\d+) [\d.]+ s after its start; "
        r"vm show boot-1:\n"
        r"disk: image busybox, 21474836480 bytes, volume loadmaster/[0-9a-f-]{36}\.qcow2\n"
        r"nic: network default, MAC (52:54:00(?::[0-9a-f]{2}){3})\n"
        r"\1's hypervisor was given: a disk of image busybox, 21474836480 bytes; "
        r"a NIC on default with MAC \2$",
        text,
        re.M,
    )
    assert booted, text
    assert "no valid host giant-1 (512 GiB): VM giant-1: no host fits" in text
    assert "short of MEMORY_MB" in text
    assert "group-rule violations: 0 at any sampled moment, 0 at the end" in text
    assert "ledger audit: 0 problem(s)" in text


def test_the_demo_places_a_vm_with_a_vf_and_one_with_a_vgpu(report: tuple[Path, str]) -> None:
    """The simulated hosts' devices: each VM holds one of its host's, as vm show and host
    show list them."""
    _, text = report
    vf = re.search(
        r"^vm show nfv-1: running on (host-0[01]), host devices: \1_0000:3B:00\.[01] "
        r"(0000:3b:0[23]\.[0-3]) -$",
        text,
        re.M,
    )
    assert vf, text
    gpu = re.search(
        r"^vm show render-1: running on (host-0[01]), host devices: \1_pci_0000_af_00_0 "
        r"0000:af:00\.0 [0-9a-f-]{36}$",
        text,
        re.M,
    )
    assert gpu, text
    assert re.search(
        rf"^host show {vf[1]}: {vf[1]}_0000:3B:00\.[01] CUSTOM_PCI_8086_154C 1/4 used, "
        rf"held by nfv-1 \({re.escape(vf[2])}\)$",
        text,
        re.M,
    ), text
    assert (
        f"host show {gpu[1]}: {gpu[1]}_pci_0000_af_00_0 VGPU 1/16 used, held by render-1 (0000:af:00.0)"
        in text
    )


def test_one_seed_places_the_mass_start_the_same_way_on_every_run(
    report: tuple[Path, str], tmp_path: Path
) -> None:
    first = json.loads((report[0].parent / "mass-start.json").read_text())
    again, _ = _run_demo(tmp_path, DEMO_ARGS)
    second = json.loads((again.parent / "mass-start.json").read_text())
    assert first["seed"] == second["seed"] == 7
    assert len(first["placements"]) == 60
    assert first == second


def test_output_to_a_pipe_is_not_wrapped(report: tuple[Path, str]) -> None:
    """Not a terminal: each line as the demo said it, however long, not cut at 80 columns
    ("44 VMs\nmoved")."""
    lines = report[1].splitlines()
    for start in ("mass start:", "memory pressure:", "drain of", "ledger:", "no valid host"):
        assert sum(line.startswith(start) for line in lines) == 1, (start, lines)
    assert re.search(r"^memory pressure: \d+ migration requests .* VMs moved$", report[1], re.M)
    assert max(len(line) for line in lines) > 80
    assert all(re.match(r"[a-z0-9]", line) for line in lines), lines  # no continuation


def test_report_is_self_contained_with_its_three_charts(report: tuple[Path, str]) -> None:
    page = report[0].read_text()
    assert page.count("<svg") == 3
    # Nothing to fetch: every src and href is inline data or a reference inside the page.
    assert re.findall(r'(?:src|href)="(?!data:|#)[^"]*"', page) == []
    for series in ("states-series-running", "states-series-pending", "states-series-migrating"):
        assert f'id="{series}"' in page, series
    for tier in ("platinum", "gold", "vapor"):
        assert f'id="tiers-series-{tier}"' in page, tier
    assert "drain" in page and "policy" in page  # both kinds of migration are listed


def _figures(text: str) -> dict[str, int]:
    """The numbers of the demo's ``ledger:`` line."""
    line = next(line for line in text.splitlines() if line.startswith("ledger:"))
    found = re.match(
        r"ledger: (\d+) placements, (\d+) launches; (?:no launch was refused|(\d+) launches "
        r"refused by their hosts, (\d+) of them placed again on another host, (\d+) not); "
        r"(\d+) migrations: (.*)$",
        line,
    )
    assert found, line
    placements, launches, refused, again, not_again, migrations, outcomes = found.groups()
    counts = dict(
        placements=int(placements),
        launches=int(launches),
        refused=int(refused or 0),
        again=int(again or 0),
        not_again=int(not_again or 0),
        migrations=int(migrations),
    )
    for n, outcome in re.findall(r"(\d+) ([a-z ]+?)(?:,|$)", outcomes):
        counts[outcome] = int(n)
    return counts


def _table(page: str, table: str) -> list[list[str]]:
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert body, table
    rows = re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]


def test_the_demos_figures_are_the_ledgers(report: tuple[Path, str]) -> None:
    """Counted again, here, from the ledger's events in the demo's database: what the demo
    printed and what its report lists are every placement, refused launch, retry and
    migration the ledger committed, not what 0.2 s samples happened to catch."""
    path, text = report
    lm = loadmaster.open(f"sqlite:///{path.parent / 'demo.db'}", migrate=False)
    try:
        events: list[VmEvent] = lm.vms.events()
    finally:
        lm.close()

    def moves(old: str, new: str) -> list[VmEvent]:
        return [e for e in events if (e.old_state, e.state) == (old, new)]

    refused = [e for e in moves("pending", "requested") if e.fault]
    retried = [
        r
        for r in refused
        if any(e.vm == r.vm and e.id > r.id for e in moves("requested", "pending"))
    ]
    began = moves("running", "migrating")
    ended = moves("migrating", "running")
    done = [e for e in ended if e.host == e.old_target]
    figures = _figures(text)
    assert figures["placements"] == len(moves("requested", "pending")) + len(
        moves("stopped", "pending")
    )
    assert figures["launches"] == len(moves("pending", "running")) >= 60
    assert figures["refused"] == len(refused)
    assert figures["again"] == len(retried)
    assert figures["not_again"] == len(refused) - len(retried)
    assert figures["migrations"] == len(began) > 0
    assert figures.get("done", 0) == len(done)
    assert figures.get("rolled back", 0) == len(ended) - len(done)

    # The SLA policies' requests add up, and those that began a migration are the
    # ledger's migrations apart from the drain's.
    line = next(line for line in text.splitlines() if line.startswith("memory pressure:"))
    asked = re.match(r"memory pressure: (\d+) migration requests from [^:]*: ([^;]*);", line)
    assert asked, line
    answers = {
        what: int(n) for n, what in re.findall(r"(\d+) ([A-Za-z ()._]+?)(?:,|$)", asked.group(2))
    }
    assert sum(answers.values()) == int(asked.group(1)), line
    drained = re.search(r"drain of (host-\d+)", text)
    assert drained
    page = path.read_text()
    table = _table(page, "migrations")
    assert len(table) == len(began)
    assert Counter(row[0] for row in table) == Counter(e.name for e in began)
    assert sum(row[2] == "policy" for row in table) == answers.get("began a migration", 0)
    assert all(row[3].startswith(drained.group(1)) for row in table if row[2] == "drain")
    refusals = _table(page, "refusals")
    if refused:
        assert Counter(row[0] for row in refusals) == Counter(e.name for e in refused)
    else:
        assert refusals == [["none"]]
    # "Every VM found a host" only if every refused VM was placed again.
    no_host = re.search(r"VMs that found no host</h2>\s*<pre>(.*?)</pre>", page, re.S)
    assert no_host
    stranded = {e.name for e in refused if e not in retried}
    assert ("every VM found a host" in no_host.group(1)) == (not stranded), no_host.group(1)
    for name in stranded:
        assert f"{name}: its launch was refused" in no_host.group(1)


def _chromium(profile: Path, *args: str) -> str:
    """Headless Chromium in a session of its own, killed whole (renderers and all) however
    it ends; its stdout."""
    assert Path(CHROMIUM).exists(), "scripts/setup.sh installs Debian's chromium"
    process = subprocess.Popen(
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
            f"--user-data-dir={profile}",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=180)
        return out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_report_renders_in_headless_chromium(report: tuple[Path, str], tmp_path: Path) -> None:
    screenshot = tmp_path / "report.png"
    _chromium(
        tmp_path / "profile",
        f"--screenshot={screenshot}",
        "--window-size=1280,2000",
        report[0].resolve().as_uri(),
    )
    assert screenshot.exists() and screenshot.stat().st_size > 10_000
    pixels = np.asarray(Image.open(screenshot).convert("RGB"))
    assert pixels.shape[:2] == (2000, 1280)
    # The states chart sits in the upper part of the page: its areas must be drawn.
    band = pixels[300:1000]
    assert np.any(band < 240, axis=-1).mean() > 0.05
    assert _count(band, STATE_COLOURS["running"]) > 2000
    assert len(np.unique(band.reshape(-1, 3), axis=0)) > 100


# Runs in the page once it has loaded and writes what it measured into <pre id="measured">:
# the browser's own geometry of each chart, then, with the page's print rules in force,
# whether any table row is cut off by a box around it.
MEASURE = """
<script>
const rect = (el) => { const r = el.getBoundingClientRect();
  return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
const colour = (el) => { const path = el.matches("path") ? el : el.querySelector("path");
  const style = getComputedStyle(path); return style.fill !== "none" ? style.fill : style.stroke; };
const charts = [...document.querySelectorAll("figure.chart")].map((figure) => ({
  id: figure.id,
  caption: (figure.querySelector("figcaption") || {textContent: ""}).textContent.trim(),
  plot: figure.querySelector('[id$="-plot-area"]') && rect(figure.querySelector('[id$="-plot-area"]')),
  legend: figure.querySelector('[id$="-legend"]') && rect(figure.querySelector('[id$="-legend"]')),
  series: [...figure.querySelectorAll('[id*="-series-"]')].map((el) => [el.id, colour(el)]),
  ticks: [...figure.querySelectorAll('g[id^="xtick_"]')].map((tick) => {
    const r = tick.firstElementChild.getBoundingClientRect(); return (r.left + r.right) / 2; }),
}));
const text = document.body.innerText;
const print = [];
for (const sheet of document.styleSheets) for (const rule of sheet.cssRules)
  if (rule.media && rule.media.mediaText.includes("print"))
    for (const inner of rule.cssRules) print.push(inner.cssText);
const style = document.createElement("style");
style.textContent = print.join("\\n");
document.head.appendChild(style);
const rows = [...document.querySelectorAll("table tbody tr")].map((row) => {
  const r = row.getBoundingClientRect();
  let cut = r.height === 0;
  for (let box = row.parentElement; box; box = box.parentElement) {
    const s = getComputedStyle(box);
    if (s.overflowX !== "visible" || s.overflowY !== "visible") {
      const b = box.getBoundingClientRect();
      cut = cut || r.top < b.top || r.bottom > b.bottom || r.left < b.left || r.right > b.right;
    }
  }
  return cut;
});
const out = document.createElement("pre");
out.id = "measured";
out.textContent = JSON.stringify({charts, text, print: print.length, rows});
document.body.appendChild(out);
</script>
"""


@pytest.fixture(scope="module")
def measured(report: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What Chromium measured of the report (see ``MEASURE``)."""
    directory = tmp_path_factory.mktemp("measured")
    page = directory / "measured.html"
    page.write_text(report[0].read_text().replace("</body>", MEASURE + "</body>"))
    dom = _chromium(
        directory / "profile", "--window-size=1280,2000", "--dump-dom", page.resolve().as_uri()
    )
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return dict(json.loads(html.unescape(found.group(1))))


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and (b["top"] < a["bottom"])
    )


def _rgb_of(css: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"\d+", css)[:3])


def _charts(measured: dict[str, Any]) -> list[dict[str, Any]]:
    charts: list[dict[str, Any]] = measured["charts"]
    assert [c["id"] for c in charts] == ["chart-states", "chart-tiers", "chart-hosts"]
    return charts


def test_every_chart_is_captioned(measured: dict[str, Any]) -> None:
    for chart in _charts(measured):
        assert len(chart["caption"]) > 40, chart["id"]


def test_legends_lie_off_the_plot_area(measured: dict[str, Any]) -> None:
    """Beside the data, not on it: the host chart's legend covered its 80-100 % band."""
    for chart in _charts(measured):
        assert chart["plot"] and chart["legend"], chart["id"]
        assert not _overlap(chart["legend"], chart["plot"]), chart


def test_every_series_has_a_colour_of_its_own(measured: dict[str, Any]) -> None:
    """12 hosts shared 10 colours: each series is now told apart from every other."""
    charts = _charts(measured)
    for chart in charts:
        colours = [_rgb_of(c) for _, c in chart["series"]]
        assert len(colours) >= 3, chart["series"]
        for a, b in itertools.combinations(colours, 2):
            assert np.linalg.norm(np.subtract(a, b)) > 40, (chart["id"], chart["series"])
    hosts = next(c for c in charts if c["id"] == "chart-hosts")
    assert len(hosts["series"]) == 6


def test_the_charts_share_one_time_axis(measured: dict[str, Any]) -> None:
    """The plot areas span the same columns of the page, and each time tick lies at the
    same place in all three charts: one moment, one place."""
    first, *others = _charts(measured)
    for chart in others:
        assert abs(chart["plot"]["left"] - first["plot"]["left"]) <= 1, chart["id"]
        assert abs(chart["plot"]["right"] - first["plot"]["right"]) <= 1, chart["id"]
        assert len(chart["ticks"]) == len(first["ticks"]) >= 3
        assert np.allclose(chart["ticks"], first["ticks"], atol=1), chart["id"]


def test_tables_print_whole(measured: dict[str, Any]) -> None:
    """With the page's print rules in force, no table row is hidden or cut off by a box
    around it (the migrations sat in a 420 px scroll box: 17 of 63 rows printed)."""
    assert len(measured["rows"]) > 10
    assert not any(measured["rows"]), f"{sum(measured['rows'])} rows cut off"
    assert measured["print"] > 0, "the page has print rules"


def test_vms_are_named_not_numbered(measured: dict[str, Any]) -> None:
    """The text named giant-1; the explanation named a uuid. No uuid is left anywhere."""
    assert UUID.findall(measured["text"]) == []
    assert "VM giant-1: no host fits" in measured["text"]


def test_the_report_points_at_its_refused_launches_where_they_are(
    report: tuple[Path, str],
) -> None:
    """The mass start's paragraph named "the table below" for a table above it."""
    page = report[0].read_text()
    assert "the table below" not in page
    heading = re.search(r"<h2>Refused launches \((\d+)\)</h2>", page)
    assert heading is not None
    refused = int(heading.group(1))
    found_no_host = page.index("<h2>Mass start: VMs that found no host</h2>")
    assert page.index("<h2>Refused launches") < found_no_host
    if refused and "no other host took it" not in page:
        assert "(Refused launches, above)" in page[found_no_host:]
