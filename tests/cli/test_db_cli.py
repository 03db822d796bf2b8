"""``loadmaster db``: schema status and upgrade, SQLite backup and restore, with one-line
errors that name what is wrong and never create an empty database by looking."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from typer.testing import CliRunner

import loadmaster
from loadmaster.cli import app
from loadmaster.cluster import VmSpec
from loadmaster.store import Store


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"LOADMASTER_DB": ""})
    return result.exit_code, " ".join(result.output.split())  # rich wraps at 80 columns


def test_status_and_upgrade_of_a_new_and_an_old_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lm.db'}"
    code, out = run("db", "status", "--db", url)
    assert code == 3 and f"no database file at {tmp_path / 'lm.db'}" in out
    assert not (tmp_path / "lm.db").exists()
    code, out = run("db", "upgrade", "--db", url, "--create")
    assert code == 0 and "schema: empty -> " in out
    head = out.split("(newest: ")[1].rstrip(")\n")
    old = tmp_path / "old.db"
    Store(f"sqlite:///{old}").migrate("0001")  # as the first release left it
    code, out = run("db", "status", "--db", f"sqlite:///{old}")
    assert code == 1 and "schema: 0001 " in out and "db upgrade" in out
    code, out = run("db", "upgrade", "--db", f"sqlite:///{old}")
    assert code == 0 and f"schema: 0001 -> {head}" in out, out
    url = f"sqlite:///{old}"
    code, out = run("db", "status", "--db", url)
    assert code == 0 and f"schema: {head} (newest: {head})" in out


def test_backup_while_writing_then_restore(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lm.db'}"
    lm = loadmaster.open(url)
    lm.hosts.create("h1", inventories={"VCPU": {"total": 64}, "MEMORY_MB": {"total": 262_144}})
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 1024}})
    stop = threading.Event()
    written: list[str] = []

    def write() -> None:
        while not stop.is_set():
            written.extend(
                v.uuid for v in lm.vms.create_many([VmSpec(f"vm-{len(written)}", "small")])
            )

    writer = threading.Thread(target=write)
    writer.start()
    try:
        code, out = run("db", "backup", str(tmp_path / "copy.db"), "--db", url)
    finally:
        stop.set()
        writer.join()
    assert code == 0, out
    assert written, "the writer must have written while the backup ran"
    with sqlite3.connect(tmp_path / "copy.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        copied = conn.execute("SELECT count(*) FROM vms").fetchone()[0]
    assert copied <= len(lm.vms.list())
    lm.close()

    code, out = run("db", "backup", str(tmp_path / "copy.db"), "--db", url)
    assert code == 4 and "never overwrites" in out
    restored = f"sqlite:///{tmp_path / 'restored.db'}"
    code, out = run("db", "restore", str(tmp_path / "copy.db"), "--db", restored)
    assert code == 0, out
    again = loadmaster.open(restored)
    try:
        assert len(again.vms.list()) == copied
        assert [h.name for h in again.hosts.list()] == ["h1"]
    finally:
        again.close()


def test_bad_input_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not a database")
    target = tmp_path / "lm.db"
    code, out = run("db", "restore", str(junk), "--db", f"sqlite:///{target}")
    assert code == 2 and "is not a SQLite database" in out and not target.exists()
    code, out = run("db", "status", "--db", "nonsense://x")
    assert code == 2 and "is not a database URL" in out and "Traceback" not in out
    code, out = run("db", "backup", str(tmp_path / "x.db"), "--db", "postgresql+psycopg://h/db")
    assert code == 2 and "pg_dump" in out
    code, out = run("db", "restore", str(tmp_path / "missing.db"), "--db", f"sqlite:///{target}")
    assert code == 3 and "no file at" in out
