"""The demo's HTML report: one self-contained page (charts inlined as SVG) that tells a
newcomer what happened and why. Its figures and tables come from the ledger's events
(``DemoResult.account``), the charts from the samples."""

from __future__ import annotations

import html
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from string import Template

from loadmaster.demo.scenario import VM_STATES, DemoResult, refusals_line, tier_guarantees
from loadmaster.report import charts


def _rows(rows: Sequence[Sequence[object]], columns: int) -> str:
    if not rows:
        return f'<tr><td colspan="{columns}">none</td></tr>'
    return "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )


def render(result: DemoResult, subtitle: str, facts: Sequence[tuple[str, str]]) -> str:
    template = Template(resources.files(__package__).joinpath("report.html").read_text())
    samples = result.samples
    times = [s.t for s in samples]
    # One time span for the three charts, from the first sample or act to the last: a
    # moment lies at the same place in each.
    span = (
        min([*times, *(start for _, start, _ in result.phases)], default=0.0),
        max([*times, *(end for _, _, end in result.phases), 1.0]),
    )
    counts = {state: [s.states.get(state, 0) for s in samples] for state in VM_STATES}
    tiers = sorted({t for s in samples for t in s.tier_min})
    minimum = {t: [s.tier_min.get(t, 1.0) for s in samples] for t in tiers}
    hosts = sorted({h for s in samples for h in s.host_memory_used})
    used = {h: [s.host_memory_used.get(h, 0.0) for s in samples] for h in hosts}
    account = result.account
    moves = [
        (
            m.name,
            m.tier,
            m.why,
            f"{m.source} → {m.destination}",
            f"{m.began:.1f}",
            "" if m.ended is None else f"{m.ended - m.began:.1f}",
            m.outcome + (f": {m.fault}" if m.fault else ""),
        )
        for m in account.moves
    ]
    refusals = [
        (r.name, r.host, f"{r.at:.1f}", r.fault, r.placed_again or "not placed again")
        for r in account.refusals
    ]
    stranded = [
        f"{r.name}: its launch was refused by {r.host}, and no other host took it"
        for r in account.refusals
        if r.placed_again is None
    ]
    no_host = "\n".join([*result.no_host, *stranded]) or "every VM found a host"
    if account.refusals and not stranded:
        no_host += f", not always the first: {refusals_line(account)} (Refused launches, above)"
    return template.substitute(
        subtitle=html.escape(subtitle),
        facts="\n".join(
            f'<div class="fact"><b>{html.escape(value)}</b>{html.escape(label)}</div>'
            for label, value in facts
        ),
        chart_states=charts.vm_states(times, counts, span, result.phases),
        chart_tiers=charts.tier_memory(times, minimum, tier_guarantees(), span, result.phases),
        chart_hosts=charts.host_memory(times, used, span, result.phases),
        migration_count=len(moves),
        migration_rows=_rows(moves, 7),
        refusal_count=len(refusals),
        refusal_rows=_rows(refusals, 5),
        no_host=html.escape(no_host),
        unplaced=html.escape("\n".join(result.drain_unplaced) or "every VM found a new host"),
        explanation=html.escape(result.explanation or "-"),
        audit=html.escape("\n".join(result.audit_problems) or "no problem"),
    )


def write_report(
    result: DemoResult, subtitle: str, facts: Sequence[tuple[str, str]], out_dir: str | Path
) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    path.write_text(render(result, subtitle, facts), encoding="utf-8")
    return path
