"""The database itself: where its schema stands, upgrades, and backup and restore of the
embedded SQLite file. ``serve`` upgrades the schema on start too; ``db upgrade`` lets an
operator do it as a step of its own, before starting the new version's servers."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from loadmaster.cli.app import app
from loadmaster.cli.client import Exit, err_console, fail
from loadmaster.settings import default, env_name

db_app = typer.Typer(
    help="The database: schema status and upgrades; backup and restore of SQLite.",
    no_args_is_help=True,
)
app.add_typer(db_app, name="db")

DbOpt = Annotated[
    str,
    typer.Option(
        "--db",
        envvar=env_name("db"),
        help="database URL: sqlite:///FILE or postgresql+psycopg://USER@HOST:PORT/DB",
    ),
]
DEFAULT_DB = default("db")


def _sqlite_file(url: str, *, must_exist: bool = True) -> Path:
    if not url.startswith("sqlite:///"):
        fail(
            f"--db: {url!r} is not a SQLite file URL; for PostgreSQL use pg_dump and "
            "pg_restore (see docs/operators-guide.md)",
            Exit.USAGE,
        )
    path = Path(url.removeprefix("sqlite:///"))
    if must_exist and not path.is_file():
        fail(f"--db: no database file at {path}", Exit.NOT_FOUND)
    return path


def _revisions(url: str) -> tuple[str | None, str]:
    from sqlalchemy.exc import ArgumentError, OperationalError

    from loadmaster.store import Store

    if url.startswith("sqlite:///"):
        _sqlite_file(url)  # never create an empty file by looking
    try:
        store = Store(url)
    except ArgumentError as exc:
        fail(f"--db: {url!r} is not a database URL ({exc})", Exit.USAGE)
    try:
        return store.revisions()
    except OperationalError as exc:
        fail(f"--db: cannot reach the database: {exc.orig}", Exit.UNREACHABLE)
    finally:
        store.dispose()


@db_app.command("status")
def db_status(db: DbOpt = DEFAULT_DB) -> None:
    """Print the schema revision the database is at and the newest this version knows;
    exit 1 when the database is behind (run `loadmaster db upgrade`)."""
    current, head = _revisions(db)
    typer.echo(f"schema: {current or 'empty'} (newest: {head})")
    if current != head:
        err_console().print("behind: run `loadmaster db upgrade`")
        raise typer.Exit(int(Exit.SERVER_ERROR))


@db_app.command("upgrade")
def db_upgrade(
    db: DbOpt = DEFAULT_DB,
    create: Annotated[
        bool, typer.Option(help="create the SQLite file when it does not exist yet")
    ] = False,
) -> None:
    """Bring the schema to the newest revision. Safe while older servers still run on
    PostgreSQL (one process migrates at a time); a no-op when already there."""
    from loadmaster.cli.server import open_database

    if db.startswith("sqlite:///") and not _sqlite_file(db, must_exist=not create).is_file():
        before = None
    else:
        before, _ = _revisions(db)
    with open_database(db, migrate=True) as lm:
        after, head = lm.store.revisions()
    typer.echo(f"schema: {before or 'empty'} -> {after} (newest: {head})")


@db_app.command("backup")
def db_backup(
    out: Annotated[Path, typer.Argument(help="file to write the copy to (must not exist)")],
    db: DbOpt = DEFAULT_DB,
) -> None:
    """A consistent copy of a SQLite database, taken while servers keep running
    (SQLite's online backup). For PostgreSQL, use pg_dump."""
    source = _sqlite_file(db)
    if out.exists():
        fail(f"OUT: {out} exists; a backup never overwrites a file", Exit.CONFLICT)
    _copy(source, out)
    typer.echo(f"backed up {source} to {out}")


@db_app.command("restore")
def db_restore(
    backup: Annotated[Path, typer.Argument(help="a file written by `loadmaster db backup`")],
    db: DbOpt = DEFAULT_DB,
) -> None:
    """Replace a SQLite database with a backup. Stop every server and agent-facing API
    using the database first; afterwards run `loadmaster db upgrade` if the backup is
    from an older version."""
    if not backup.is_file():
        fail(f"BACKUP: no file at {backup}", Exit.NOT_FOUND)
    try:
        with sqlite3.connect(f"file:{backup}?mode=ro", uri=True) as check:
            ok = check.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        fail(f"BACKUP: {backup} is not a SQLite database ({exc})", Exit.USAGE)
    if ok != "ok":
        fail(f"BACKUP: {backup} fails SQLite's integrity check: {ok}", Exit.USAGE)
    target = _sqlite_file(db, must_exist=False)
    _copy(backup, target)
    typer.echo(f"restored {target} from {backup}")


def _copy(source: Path, target: Path) -> None:
    # The backup API copies pages under SQLite's own locking, so a server writing at the
    # same time never leaves a torn copy (a file copy of a WAL database can).
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
