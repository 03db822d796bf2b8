"""Commands that run the control plane here: the API server, its settings, and the
audit of a database. Heavy packages are imported inside each command, so
``loadmaster --help`` stays quick."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loadmaster.cli.app import RemoteCommand, TlsKeyOpt, api, app, chosen
from loadmaster.cli.client import Exit, err_console, fail
from loadmaster.cli.output import JsonOpt, show, warn
from loadmaster.errors import LoadmasterError
from loadmaster.settings import OPTIONS, default, env_name

if TYPE_CHECKING:
    from loadmaster.service import Loadmaster


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
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            envvar=env_name("tls_cert"),
            help="serve HTTPS with this PEM certificate (read again on SIGHUP)",
        ),
    ] = None,
    tls_key: TlsKeyOpt = None,
    tls_client_ca: Annotated[
        Path | None,
        typer.Option(envvar=env_name("tls_client_ca"), help=OPTIONS["tls_client_ca"].description),
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
    agent_heard_every: Annotated[
        float,
        typer.Option(
            min=0.1,
            envvar=env_name("agent_heard_every"),
            help=OPTIONS["agent_heard_every"].description,
        ),
    ] = default("agent_heard_every"),
    fence_command: Annotated[
        str,
        typer.Option(envvar=env_name("fence_command"), help=OPTIONS["fence_command"].description),
    ] = default("fence_command"),
    fence_timeout: Annotated[
        float,
        typer.Option(
            min=0.001, envvar=env_name("fence_timeout"), help=OPTIONS["fence_timeout"].description
        ),
    ] = default("fence_timeout"),
) -> None:
    """Serve the HTTP API (tokens from --tokens FILE or LOADMASTER_TOKENS="tok:admin,...";
    HTTPS with --tls-cert, agents' client certificates with --tls-client-ca)."""
    import uvicorn

    from loadmaster.api.auth import resolve_auth
    from loadmaster.settings_model import load_settings

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
    if tls_cert is None and (tls_key is not None or tls_client_ca is not None):
        fail("--tls-key and --tls-client-ca need --tls-cert (the server's certificate)", Exit.USAGE)
    if tls_cert is not None:
        from loadmaster.api.tls import check_server_files

        try:
            check_server_files(tls_cert, tls_key, tls_client_ca)
        except LoadmasterError as exc:
            fail(exc.detail, Exit.USAGE)
    # Worker processes read their settings from the environment (api.app.app_from_env).
    chosen = {
        "db": db,
        "max_body": max_body,
        "agent_silent_after": agent_silent_after,
        "agent_heard_every": agent_heard_every,
        "fence_command": fence_command,
        "fence_timeout": fence_timeout,
    }
    if no_auth:
        chosen["no_auth"] = True
    if tokens is not None:
        chosen["tokens_file"] = tokens.resolve()
    # Absolute: a SIGHUP reads the certificate again, whatever the directory by then.
    files = {"tls_cert": tls_cert, "tls_key": tls_key, "tls_client_ca": tls_client_ca}
    chosen.update({name: path.resolve() for name, path in files.items() if path is not None})
    for name, value in chosen.items():
        os.environ[env_name(name)] = str(value)
    try:
        load_settings()  # the options together: a threshold below what liveness allows
    except LoadmasterError as exc:
        fail(exc.detail, Exit.USAGE)
    fencing = _fencing_note(fence_command, agent_silent_after)
    # Migrate once here, so workers starting together find the schema ready.
    open_database(db, migrate=True).close()
    auth_note = "no auth" if no_auth else "bearer tokens"
    if tls_client_ca is not None:
        auth_note += " or agents' client certificates"
    scheme = "https" if tls_cert is not None else "http"
    err_console().print(
        f"loadmaster API on {scheme}://{host}:{port} ({db.split('://')[0]}, {workers} worker(s), "
        f"{auth_note})"
    )
    err_console().print(fencing)
    from loadmaster.api.observability import configure_logging
    from loadmaster.api.server import (
        GRACEFUL_SHUTDOWN_S,
        LISTEN_BACKLOG,
        NoDelayHTTPProtocol,
        raise_open_files_limit,
    )
    from loadmaster.api.supervisor import HEALTHCHECK_S
    from loadmaster.api.uvicorn_workers import run_server

    raise_open_files_limit()
    configure_logging()  # the supervisor's lines, as the workers', are JSON
    tls: dict[str, Any] = {}
    if tls_cert is not None:
        import ssl

        from loadmaster.api.tls import server_context

        tls = {
            "ssl_certfile": chosen["tls_cert"],
            "ssl_keyfile": chosen.get("tls_key"),
            "ssl_ca_certs": chosen.get("tls_client_ca"),
            # Asked for, not required: operators and token-holding agents send none.
            "ssl_cert_reqs": ssl.CERT_OPTIONAL if tls_client_ca is not None else ssl.CERT_NONE,
            "ssl_context_factory": server_context,
        }
    run_server(
        uvicorn.Config(
            "loadmaster.api.app:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            access_log=False,  # our middleware logs each request as JSON, with its id
            log_level="warning",
            http=NoDelayHTTPProtocol,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            timeout_worker_healthcheck=HEALTHCHECK_S,
            # Agents reconnecting together after a restart queue in the kernel, not refused.
            backlog=LISTEN_BACKLOG,
            **tls,
        )
    )


def _fencing_note(fence_command: str, silent_after: float) -> str:
    """What the server will do about a host whose agent falls silent; a fence command
    that cannot be run is refused now, not found out when a host dies."""
    if not fence_command.strip():
        return (
            "no fence command (--fence-command): a host whose agent falls silent is shown "
            "silent and never fenced; its VMs are restarted elsewhere only when you run "
            "loadmaster host evacuate HOST --confirm-down"
        )
    try:
        program = shlex.split(fence_command)[0]
    except ValueError as exc:
        fail(f"--fence-command: {exc}", Exit.USAGE)
    if shutil.which(program) is None:
        fail(
            f"--fence-command: {program} is not an executable file (nor on PATH); hosts "
            "whose agent falls silent could not be fenced",
            Exit.USAGE,
        )
    return (
        f"fencing with {fence_command}: a host whose agent is silent {silent_after:g} s is "
        "fenced and its VMs restarted elsewhere, unless more than half the fleet is silent"
    )


@app.command("settings")
def settings_command(as_json: JsonOpt = False) -> None:
    """Every option loadmaster reads from the environment (LOADMASTER_<NAME>): the value
    this shell gives it, secrets hidden, and what it does (docs/configuration.md)."""
    from loadmaster.settings_model import load_settings

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
    VM states matching their records, group rules) and that its hosts agree (no VM
    running or pending on a host that is down, none running where its host's agent last
    reported no such guest); exit 1 if one is broken. Reads the
    database given by --db, or asks a server. Claims pending too long on hosts whose agent
    is silent or absent are warned about (they are kept, and do not change the exit code)."""
    if db is not None and remote:
        fail("--db audits a database here, --remote a server: give one of them", Exit.USAGE)
    if db is None and (remote or chosen.url is not None):
        answer = api().get("/audit")
        problems = [(p["kind"], p["subject"], p["detail"]) for p in answer["problems"]]
        warnings = answer["warnings"]
    else:
        from loadmaster.pending import audit as run_audit
        from loadmaster.settings_model import load_settings

        url = db or load_settings().db
        try:
            with open_database(url, migrate=False) as lm:
                problems = [(p.kind, p.subject, p.detail) for p in run_audit(lm.store)]
                warnings = [w.warning for w in lm.waiting.find()]
        except LoadmasterError as exc:
            fail(f"--db {url!r}: {exc.detail}", Exit.UNREACHABLE)
    for kind, subject, detail in problems:
        err_console().print(f"{kind}: {subject}: {detail}", markup=False)
    warn(warnings)
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
