"""``loadmaster demo``: the whole loop on the embedded SQLite default, in one process.

Starts the API and one real agent per simulated host (host manager + SLA policy loop, over
HTTP with tokens bound to their host); mass-starts VMs through the scheduler, lets memory
pressure build, drains a host; prints what happened and writes an HTML report that
explains it (see ``loadmaster.demo.scenario``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loadmaster.cli.app import app
from loadmaster.cli.client import Exit, fail
from loadmaster.cli.output import console
from loadmaster.logs import UtcFormatter

if TYPE_CHECKING:
    from loadmaster.demo.scenario import ImageBoot
    from loadmaster.service import Loadmaster


def _log_to(path: Path) -> None:
    """The agents' and the API's log lines go to a file beside the report: on the console
    they would drown the story (a 409 for a migration already under way is routine)."""
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(UtcFormatter("%(asctime)s %(threadName)s %(name)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def _say(line: str) -> None:
    from rich.text import Text

    head, colon, rest = line.partition(":")
    console().print(Text.assemble((head, "bold"), colon + rest) if colon else line)


def _violations(lm: Loadmaster) -> int:
    from loadmaster.pending import group_rule_problems

    return len(group_rule_problems(lm.store))


def _say_image_boot(boot: ImageBoot | None) -> bool:
    """What ``vm show`` says of the VM booted from an image, and what its host's
    hypervisor was given; whether it runs with them."""
    from loadmaster.cli.remote.vms import guest_device_lines

    if boot is None:
        return False
    vm = boot.vm
    if vm["state"] != "running" or boot.disk is None or not boot.nics:
        _say(f"from an image: {vm['name']} is {vm['state']}: {vm.get('fault') or 'no fault'}")
        return False
    _say(
        f"from an image: {vm['name']} running on {vm['host']} {boot.seconds:.1f} s after "
        f"its start; vm show {vm['name']}:"
    )
    for line in guest_device_lines(vm):
        _say(line)
    nics = ", ".join(f"{n.network} with MAC {n.mac}" for n in boot.nics)
    _say(
        f"{vm['host']}'s hypervisor was given: a disk of image {boot.disk.image}, "
        f"{boot.disk.size_bytes} bytes; a NIC on {nics}"
    )
    return True


@app.command("demo")
def demo(
    db: Annotated[
        str, typer.Option(help="SQLite database, recreated on each run")
    ] = "sqlite:///loadmaster-demo.db",
    hosts: Annotated[int, typer.Option(min=3, help="simulated hosts, one agent each")] = 12,
    vms: Annotated[int, typer.Option(min=30, help="VMs to mass-start")] = 160,
    out: Annotated[Path, typer.Option(help="report directory")] = Path("loadmaster-report"),
    seed: Annotated[int, typer.Option(help="random seed of the scenario")] = 7,
    cycle: Annotated[
        float, typer.Option(min=0.05, help="seconds between SLA policy cycles on each host")
    ] = 0.4,
    ramp: Annotated[
        int, typer.Option(min=5, help="SLA cycles until the guests' memory demand peaks")
    ] = 25,
) -> None:
    """Run the whole loop on simulated hosts with real agents and write a report."""
    if not db.startswith("sqlite:///") or db == "sqlite:///:memory:":
        fail("the demo recreates its database: give --db sqlite:///FILE", Exit.USAGE)
    # The scenario starts a server and threads; it loads here, not whenever the CLI starts.
    from loadmaster.demo.scenario import refusals_line, run
    from loadmaster.report import write_report
    from loadmaster.service import open_loadmaster

    started = time.perf_counter()
    database = Path(db.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        database.with_name(database.name + suffix).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    _log_to(out / "agents.log")
    with open_loadmaster(db) as lm:
        result = run(
            lm,
            hosts=hosts,
            vms=vms,
            seed=seed,
            cycle_s=cycle,
            ramp_cycles=ramp,
            violations=_violations,
            progress=_say,
        )
    account = result.account
    for line in result.no_host:
        _say(f"no host in the mass start: {line}")
    for r in account.refusals:
        again = f"placed again on {r.placed_again}" if r.placed_again else "not placed again"
        _say(f"launch refused: {r.name} by {r.host} at {r.at:.1f} s, {again}")
    _say(
        f"ledger: {account.placements} placements, {account.launches} launches; "
        f"{refusals_line(account)}; {len(account.moves)} migrations: "
        + (", ".join(f"{n} {what}" for what, n in sorted(account.outcomes().items())) or "none")
    )
    booted = _say_image_boot(result.image_boot)
    _say(f"no valid host giant-1 (512 GiB): {result.explanation}")
    _say(
        f"group-rule violations: {result.peak_violations} at any sampled moment, "
        f"{result.violations} at the end"
    )
    _say(f"ledger audit: {len(result.audit_problems)} problem(s)")
    policy, drain = account.outcomes("policy"), account.outcomes("drain")
    facts = [
        ("hosts, one agent each", str(len(result.hosts))),
        ("VMs mass-started", str(result.vms)),
        ("running after the mass start", str(result.running_after_start)),
        (
            "VMs/s from request to up",
            f"{result.running_after_start / max(result.mass_start_seconds, 1e-9):.0f}",
        ),
        ("launches refused by their host", str(len(account.refusals))),
        ("of them placed again", str(account.retries)),
        ("migrations asked by SLA policies", str(sum(result.migration_requests.values()))),
        ("of them begun", str(result.migration_requests.get("began", 0))),
        ("moved for memory pressure", str(policy.get("done", 0))),
        (f"moved off {result.drained_host} (drain)", str(drain.get("done", 0))),
        ("migrations rolled back", str(account.outcomes().get("rolled back", 0))),
        ("drain time (s)", f"{result.drain_seconds:.1f}"),
        ("vapor VMs powered off", str(result.vapor_stopped)),
        ("group-rule violations (peak)", str(result.peak_violations)),
        ("ledger audit problems", str(len(result.audit_problems))),
    ]
    subtitle = (
        f"{len(result.hosts)} simulated hosts, {result.vms} VMs, seed {seed}, database {db}, "
        f"{time.perf_counter() - started:.0f} s from an empty database to this report"
    )
    report = write_report(result, subtitle, facts, out)
    # For comparing runs: the same seed places the mass start the same way.
    (out / "mass-start.json").write_text(
        json.dumps(
            {"seed": seed, "batch_seeds": result.batch_seeds, "placements": result.mass_start},
            indent=1,
            sort_keys=True,
        )
    )
    _say(f"report: {report.resolve()} ({time.perf_counter() - started:.1f} s)")
    if result.peak_violations or result.audit_problems or not booted:
        raise typer.Exit(Exit.SERVER_ERROR)
