"""The demo's HTML report: one self-contained page (charts inlined as base64 PNG)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from loadmaster.report import charts
from loadmaster.report.charts import Usage


@dataclass
class ReportData:
    subtitle: str
    facts: Sequence[tuple[str, str]]
    hosts: Sequence[str]
    before: Mapping[str, Usage]
    after: Mapping[str, Usage]
    decision_ms: Sequence[float]
    timeline: Sequence[tuple[float, int, int]]
    top_head: Sequence[str]
    top_rows: Sequence[Sequence[object]]
    explanation: str = ""


def render(data: ReportData) -> str:
    template = Template(resources.files(__package__).joinpath("report.html").read_text())
    escape = html.escape
    return template.substitute(
        subtitle=escape(data.subtitle),
        facts="\n".join(
            f'<div class="fact"><b>{escape(value)}</b>{escape(label)}</div>'
            for label, value in data.facts
        ),
        chart_utilisation=charts.utilisation(data.hosts, data.before, data.after),
        chart_histogram=charts.placement_times(data.decision_ms),
        chart_timeline=charts.timeline(data.timeline),
        top_head="".join(f"<th>{escape(h)}</th>" for h in data.top_head),
        top_rows="\n".join(
            "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>"
            for row in data.top_rows
        ),
        explanation=escape(data.explanation or "every VM found a host"),
    )


def write_report(data: ReportData, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    path.write_text(render(data), encoding="utf-8")
    return path
