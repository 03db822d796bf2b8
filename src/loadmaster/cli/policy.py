"""``loadmaster policy ...``: check SLA policy files and try them on a snapshot, with no
server or host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loadmaster.cli.app import app
from loadmaster.cli.client import Exit, err_console, fail, print_json
from loadmaster.errors import LoadmasterError

if TYPE_CHECKING:
    pass

policy_app = typer.Typer(help="Check and try out host SLA policies.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")

PolicyPaths = Annotated[
    list[Path],
    typer.Argument(
        exists=True,
        help="policy files, or a directory: its *.policy files in name order, as the "
        "agent's --policy-dir",
    ),
]


def _policy_files(paths: list[Path]) -> list[Path]:
    from loadmaster.policy.engine import policy_dir_files

    files = [f for p in paths for f in (policy_dir_files(p) if p.is_dir() else [p])]
    if not files:
        fail(f"no *.policy file in {', '.join(map(str, paths))}", Exit.USAGE)
    return files


@policy_app.command("check")
def policy_check(paths: PolicyPaths) -> None:
    """Report every syntax and shape problem; exit 1 if there is one."""
    from loadmaster.policy import check_files

    files = _policy_files(paths)
    problems = check_files(files)
    for problem in problems:
        err_console().print(str(problem))
    if problems:
        raise typer.Exit(int(Exit.SERVER_ERROR))
    err_console().print(f"{len(files)} file(s) OK")


@policy_app.command("eval")
def policy_eval(
    paths: PolicyPaths,
    snapshot: Annotated[
        Path,
        typer.Option(
            exists=True,
            dir_okay=False,
            help='snapshot JSON: {"host": {"stats": {...}, "history": [...], "properties": '
            '{...}}, "guests": [{"name": "vm-1", "tags": [...], "stats": {...}}]} '
            "(docs/operators-guide.md, Agents and policies)",
        ),
    ],
    collectors: Annotated[
        str | None,
        typer.Option(
            help="evaluate as an agent with these collectors would (a set: vdsm, "
            "mom-libvirt, loadmaster (the agent's default), or collector names): only their "
            "fields readable, the tick skipped when the host lacks a mandatory field, guests "
            "lacking one left out, StatAvg over accepted samples only",
        ),
    ] = None,
) -> None:
    """Run one policy cycle on a snapshot of a host and its guests and print the controls
    the policy sets as JSON: host controls, per-guest controls, stats the policy missed,
    guests left out, controls refused, why the agent would skip the tick, and for a guest
    asked both to stop and to migrate, which one the agent carries out."""
    from loadmaster.policy.offline import evaluate_snapshot

    files = _policy_files(paths)
    try:
        data = json.loads(snapshot.read_text())
    except json.JSONDecodeError as exc:
        fail(f"{snapshot}: not JSON: {exc}", Exit.USAGE)
    try:
        print_json(evaluate_snapshot(files, data, collectors))
    except ValueError as exc:
        fail(f"--collectors: {exc}", Exit.USAGE)
    except LoadmasterError as exc:
        fail(exc.detail, Exit.SERVER_ERROR)
