"""Commands that run here, not against a server: the server itself, the host agent, the
host simulation and the policy tools. Heavy packages are imported inside each command,
so ``loadmaster --help`` stays quick."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loadmaster.cli.app import RemoteCommand, api, app, chosen
from loadmaster.cli.client import Exit, err_console, exit_code_for, fail, print_json
from loadmaster.cli.output import JsonOpt, show
from loadmaster.errors import LoadmasterError
from loadmaster.settings import OPTIONS, default, env_name, load_settings

if TYPE_CHECKING:
    from loadmaster.service import Loadmaster

policy_app = typer.Typer(help="Check and try out host SLA policies.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")


@app.command("serve")
def serve(
    db: Annotated[
        str,
        typer.Option(envvar=env_name("db"), help="sqlite:///FILE or postgresql+psycopg://..."),
    ] = default("db"),
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8080,
    workers: Annotated[int, typer.Option(help="worker processes (PostgreSQL only)")] = 1,
    no_auth: Annotated[
        bool,
        typer.Option("--no-auth", envvar=env_name("no_auth"), help="no tokens: local use only"),
    ] = False,
    tokens: Annotated[
        Path | None,
        typer.Option(
            envvar=env_name("tokens_file"),
            help="token file (.toml/.yaml/.json): [tokens] TOKEN = ROLE",
        ),
    ] = None,
    max_body: Annotated[
        int,
        typer.Option(envvar=env_name("max_body"), help="largest request body in bytes"),
    ] = default("max_body"),
    agent_silent_after: Annotated[
        float,
        typer.Option(
            min=1.0,
            envvar=env_name("agent_silent_after"),
            help="seconds without a word from a host's agent before the host and its VMs "
            "are shown as silent (their claims are kept)",
        ),
    ] = default("agent_silent_after"),
) -> None:
    """Serve the HTTP API (tokens from --tokens FILE or LOADMASTER_TOKENS="tok:admin,...")."""
    import uvicorn

    from loadmaster.api.auth import resolve_auth

    if workers < 1:
        fail("--workers must be at least 1", Exit.USAGE)
    if workers > 1 and db.startswith("sqlite"):
        fail(
            "--workers > 1 needs PostgreSQL: SQLite takes one writer at a time, so several "
            "processes would only queue on its lock. Use --db postgresql+psycopg://...",
            Exit.USAGE,
        )
    try:
        resolve_auth(
            no_auth=no_auth, tokens_file=tokens, inline=load_settings().tokens.get_secret_value()
        )
    except LoadmasterError as exc:
        fail(exc.detail, Exit.USAGE)
    except OSError as exc:
        fail(f"cannot read {tokens}: {exc}", Exit.USAGE)
    # Migrate once here, so workers starting together find the schema ready.
    open_database(db, migrate=True).close()
    # Worker processes read their settings from the environment (api.app.app_from_env).
    chosen = {"db": db, "max_body": max_body, "agent_silent_after": agent_silent_after}
    if no_auth:
        chosen["no_auth"] = True
    if tokens is not None:
        chosen["tokens_file"] = tokens.resolve()
    for name, value in chosen.items():
        os.environ[env_name(name)] = str(value)
    auth_note = "no auth" if no_auth else "bearer tokens"
    err_console().print(
        f"loadmaster API on http://{host}:{port} ({db.split('://')[0]}, {workers} worker(s), {auth_note})"
    )
    uvicorn.run(
        "loadmaster.api.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        access_log=False,  # our middleware logs each request as JSON, with its id
        log_level="warning",
    )


@app.command("settings")
def settings_command(as_json: JsonOpt = False) -> None:
    """Every option loadmaster reads from the environment (LOADMASTER_<NAME>): the value
    this shell gives it, secrets hidden, and what it does (docs/configuration.md)."""
    try:
        current = load_settings()
    except LoadmasterError as exc:
        fail(exc.detail, Exit.USAGE)
    rows = []
    for name, option in OPTIONS.items():
        value = getattr(current, name)
        if hasattr(value, "get_secret_value"):
            value = "(set)" if value.get_secret_value() else None
        rows.append(
            {
                "name": name,
                "variable": env_name(name),
                "value": None if value is None else str(value),
                "description": option.description,
            }
        )
    show(
        rows,
        as_json,
        "Settings (from the environment; a command-line option wins)",
        ["variable", "value", "what it does"],
        [(r["variable"], r["value"], r["description"]) for r in rows],
    )


@app.command("agent")
def agent(
    hypervisor: Annotated[str, typer.Option(help="libvirt URI, e.g. qemu:///system")],
    policy_dir: Annotated[Path, typer.Option(help="directory of *.policy files")],
    driver: Annotated[
        str | None,
        typer.Option(
            help="hypervisor driver, an entry of loadmaster.hypervisors (default: host.driver "
            "in --config, else libvirt)"
        ),
    ] = None,
    interval: Annotated[float, typer.Option(help="seconds between cycles")] = 15.0,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", help="loadmaster API to register with and report to (none: SLA policy only)"
        ),
    ] = None,
    api_alias: Annotated[
        str | None, typer.Option("--api", hidden=True, help="deprecated name of --url")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar=env_name("token"), help="the agent's token (role agent:<host>)"),
    ] = None,
    host_name: Annotated[str | None, typer.Option(help="default: this machine's name")] = None,
    cycles: Annotated[int | None, typer.Option(help="stop after N cycles")] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="journal every applied control here, e.g. /var/lib/loadmaster/agent "
            "(see agent-journal); default: no journal"
        ),
    ] = None,
    sys_root: Annotated[
        Path | None,
        typer.Option(
            help="where KSM is written (<root>/kernel/mm/ksm); default: /sys for a real "
            "hypervisor, in memory for the test driver (test:///...)"
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="the host's resource configuration (TOML: [host], [reserved], "
            "[allocation_ratio], [resources]); see loadmaster.agent.manager.ManagerConfig",
        ),
    ] = None,
    collectors: Annotated[
        str | None,
        typer.Option(
            help="collector set, as MOM's [host]/[guest] collectors: vdsm, mom-libvirt or "
            "loadmaster (default), or collector names separated by commas (MOM's, such as "
            "HostMemory,GuestBalloon, or any registered in loadmaster.host_collectors / "
            "loadmaster.guest_collectors); it decides which fields policies can read"
        ),
    ] = None,
    guest_kernel: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="kernel the guests it launches on QEMU boot directly (with --guest-initrd; "
            "e.g. from scripts/guest-image.sh); not needed on the test driver",
        ),
    ] = None,
    guest_initrd: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="their initramfs")
    ] = None,
    guest_console_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False, help="append each guest's serial console to <dir>/<name>.serial"
        ),
    ] = None,
    migration_data_uri: Annotated[
        str | None,
        typer.Option(
            help="where destination QEMUs listen for live-migration data, tcp://ADDRESS "
            "(e.g. tcp://127.0.0.1 when all hosts are this machine); default: the "
            "destination's host name. Not the libvirt URI other hosts reach this one by "
            "(that is host.migration_uri in --config)"
        ),
    ] = None,
) -> None:
    """Run the host agent. With --url it is the host's manager: it registers the host with
    the inventory it discovers, launches, moves and removes guests as the scheduler placed
    them, and reports; always, it applies the SLA policy every --interval."""
    from loadmaster.agent import run_agent
    from loadmaster.agent.collectors import collector_selection
    from loadmaster.agent.libvirt_hv import GuestImage
    from loadmaster.agent.loop import CycleReport
    from loadmaster.agent.narration import CycleNarrator
    from loadmaster.apiclient import ApiError, ApiUnreachable

    if url is not None and api_alias is not None and url != api_alias:
        fail("--api is the old name of --url: give one of them", Exit.USAGE)
    api_url = url or api_alias
    if collectors is not None:
        try:
            collector_selection(collectors)
        except ValueError as exc:
            fail(f"--collectors: {exc}", Exit.USAGE)
    if (guest_kernel is None) != (guest_initrd is None):
        fail("--guest-kernel and --guest-initrd go together", Exit.USAGE)
    image = None
    if guest_kernel is not None and guest_initrd is not None:
        image = GuestImage(
            kernel=guest_kernel.resolve(),
            initrd=guest_initrd.resolve(),
            log_dir=guest_console_dir.resolve() if guest_console_dir else None,
        )
    narrator = CycleNarrator()

    def narrate(report: CycleReport) -> None:
        # Plain lines, never wrapped: they end up in journald and in grep.
        sys.stderr.writelines(f"{line}\n" for line in narrator.lines(report, datetime.now(UTC)))

    try:
        run_agent(
            hypervisor,
            policy_dir,
            interval,
            api_url,
            token,
            host_name,
            cycles,
            state_dir,
            sys_root,
            config,
            collectors=collectors,
            guest_image=image,
            migration_data_uri=migration_data_uri,
            on_cycle=narrate,
            driver=driver,
        )
    except LoadmasterError as exc:
        fail(exc.detail, Exit.SERVER_ERROR)
    except ApiUnreachable as exc:
        fail(str(exc), Exit.UNREACHABLE)
    except ApiError as exc:
        fail(str(exc), exit_code_for(exc.status))


@app.command("agent-journal")
def agent_journal(
    state_dir: Annotated[
        Path, typer.Option(exists=True, file_okay=False, help="the agent's --state-dir")
    ],
    as_json: JsonOpt = False,
) -> None:
    """What the agent's journal says it applied: the last value of every control, and the
    cycles that started but never ended (an agent killed mid-cycle). The hypervisor may be
    one call ahead of an interrupted cycle, never behind the journal."""
    from loadmaster.agent.journal import agent_running, read_journal

    try:
        state = read_journal(state_dir)
    except LoadmasterError as exc:
        fail(exc.detail, Exit.SERVER_ERROR)
    running = agent_running(state_dir)
    records = sorted(state.last.values(), key=lambda r: (r.target, r.control))
    data = {
        "agent_running": running,
        "cycles_ended": state.cycles_ended,
        "torn_bytes": state.torn_bytes,
        "applied": [asdict(r) for r in records],
        "interrupted": [asdict(c) for c in state.interrupted],
        "open_cycle": None if state.open_cycle is None else asdict(state.open_cycle),
    }
    rows = [(r.target, r.control, r.value, r.cycle, _when(r.time)) for r in records]
    title = (
        f"Applied controls ({state.cycles_ended} cycles ended, "
        f"agent {'running' if running else 'not running'})"
    )
    show(data, as_json, title, ("target", "control", "value", "cycle", "applied at"), rows)
    if as_json or not state.interrupted:
        return
    in_progress = state.open_cycle if running else None
    cycles = [
        (c.cycle, _when(c.started), c.applied, c.policy[:12], c is in_progress)
        for c in state.interrupted
    ]
    columns = ("cycle", "started", "journalled", "policy", "in progress")
    show(data, False, "Cycles that never ended", columns, cycles)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")


@app.command("simulate-host")
def simulate_host(
    guests: Annotated[int, typer.Option(help="guests on the simulated host")] = 40,
    steps: Annotated[int, typer.Option(help="policy cycles to simulate")] = 120,
    seed: Annotated[int, typer.Option(help="random seed of the guests' demand")] = 1,
    out: Annotated[Path, typer.Option(help="where CSV, PNG and HTML go")] = Path("simulation"),
) -> None:
    """Simulate one host under memory pressure, with and without the shipped policies."""
    from loadmaster.agent import simulate_host as simulate

    result = simulate(guests, steps, seed, out)
    for label, value in result.figures():
        err_console().print(f"{label}: {value}", markup=False)
    err_console().print(f"report: {result.html_path}", markup=False)


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
) -> None:
    """Run one policy cycle on a snapshot of a host and its guests and print the controls
    the policy sets as JSON: host controls, per-guest controls, stats the policy missed,
    guests left out and controls refused."""
    from loadmaster.policy import eval_files

    files = _policy_files(paths)
    try:
        data = json.loads(snapshot.read_text())
    except json.JSONDecodeError as exc:
        fail(f"{snapshot}: not JSON: {exc}", Exit.USAGE)
    try:
        print_json(eval_files(files, data))
    except LoadmasterError as exc:
        fail(exc.detail, Exit.SERVER_ERROR)


@app.command("audit", cls=RemoteCommand)
def audit(
    db: Annotated[
        str | None,
        typer.Option(help=f"database URL to audit here (default: {default('db')})"),
    ] = None,
    remote: Annotated[
        bool,
        typer.Option(
            "--remote",
            help="ask the server at --url (GET /audit, a reader token is enough); "
            "implied by --url (before or after audit) or LOADMASTER_URL",
        ),
    ] = False,
) -> None:
    """Check the ledger's promises (no host over capacity, no orphaned or partial claims,
    VM states matching their records, group rules); exit 1 if one is broken. Reads the
    database given by --db, or asks a server."""
    if db is not None and remote:
        fail("--db audits a database here, --remote a server: give one of them", Exit.USAGE)
    if db is None and (remote or chosen.url is not None):
        problems = [(p["kind"], p["subject"], p["detail"]) for p in api().get("/audit")["problems"]]
    else:
        from loadmaster.pending import audit as run_audit

        url = db or load_settings().db
        try:
            with open_database(url, migrate=False) as lm:
                problems = [(p.kind, p.subject, p.detail) for p in run_audit(lm.store)]
        except LoadmasterError as exc:
            fail(f"--db {url!r}: {exc.detail}", Exit.UNREACHABLE)
    for kind, subject, detail in problems:
        err_console().print(f"{kind}: {subject}: {detail}", markup=False)
    if problems:
        raise typer.Exit(int(Exit.SERVER_ERROR))
    err_console().print("no problems found")


def open_database(url: str, *, migrate: bool) -> Loadmaster:
    """The service on ``url``, or one line saying why not. Without ``migrate`` the
    database must exist already: SQLite would create an empty file, and a command that
    only reads would then fail on its missing tables."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from loadmaster.service import open_loadmaster

    try:
        parsed = make_url(url)
    except ArgumentError:
        fail(
            f"--db {url!r}: not a database URL (sqlite:///FILE or postgresql+psycopg://...)",
            Exit.USAGE,
        )
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        fail(f"--db {url!r}: only sqlite and postgresql databases are supported", Exit.USAGE)
    if (
        not migrate
        and parsed.get_backend_name() == "sqlite"
        and parsed.database not in (None, "", ":memory:")
    ):
        path = Path(parsed.database or "")
        if not path.is_file():
            fail(f"--db: no database at {path.resolve()} (give --db sqlite:///PATH)", Exit.USAGE)
    try:
        return open_loadmaster(url, migrate=migrate)
    except LoadmasterError as exc:
        fail(f"--db {url!r}: {exc.detail}", Exit.UNREACHABLE)
    except (SQLAlchemyError, ImportError, OSError) as exc:
        reason = str(exc).splitlines()[0]
        fail(f"--db {url!r}: {reason}", Exit.UNREACHABLE)
