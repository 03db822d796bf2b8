"""SQLite writers of one process take turns on the store's own lock before ``BEGIN
IMMEDIATE``: a writer that arrives while another holds the database waits on the lock
(woken when that one commits), not inside SQLite's busy handler, whose sleeps grow to
100 ms steps."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from sqlalchemy import event

import loadmaster
from loadmaster.store.locking import clock


def test_a_second_writer_waits_for_its_turn_before_begin_immediate(tmp_path: Path) -> None:
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'turns.db'}")
    try:
        begun: list[str] = []

        def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if statement.startswith("BEGIN IMMEDIATE"):
                begun.append(threading.current_thread().name)

        event.listen(lm.store.engine, "before_cursor_execute", note)
        holding, release = threading.Event(), threading.Event()
        second_done = threading.Event()

        def first() -> None:
            with lm.store.write() as session:
                clock(session)
                holding.set()
                release.wait(30)

        def second() -> None:
            with lm.store.write() as session:
                clock(session)
            second_done.set()

        one = threading.Thread(target=first, name="first")
        one.start()
        assert holding.wait(30)
        two = threading.Thread(target=second, name="second")
        two.start()
        # The second writer is queued on the lock: it has sent nothing to SQLite.
        assert not second_done.wait(0.5)
        assert begun == ["first"]
        release.set()
        one.join(30)
        two.join(30)
        assert second_done.is_set()
        assert begun == ["first", "second"]
    finally:
        lm.close()
