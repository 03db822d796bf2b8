"""SQLite's write-ahead log is folded back by the store's own thread, not by whichever
commit takes it past 1,000 pages (``store/checkpoints.py``)."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import text

import loadmaster
from loadmaster.store.checkpoints import GATHER_S


def _wait_for(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the checkpoint thread did not run"
        time.sleep(0.02)


def test_writes_are_folded_back_by_the_thread_and_it_stops_with_the_store(
    tmp_path: Path,
) -> None:
    lm = loadmaster.open(f"sqlite:///{tmp_path / 'lm.db'}")
    store = lm.store
    checkpointer = store._checkpointer
    assert checkpointer is not None
    with store.engine.connect() as connection:
        # No commit checkpoints by itself: they would wait in the writers' turn.
        assert connection.execute(text("PRAGMA wal_autocheckpoint")).scalar() == 0
    for i in range(20):
        lm.hosts.create(f"h{i}", inventories={"VCPU": {"total": 8}})
    before = checkpointer.checkpoints
    lm.hosts.create("last", inventories={"VCPU": {"total": 8}})
    # The checkpoint after the last write folds back every frame the log holds.
    _wait_for(lambda: checkpointer.checkpoints > before)
    _wait_for(lambda: checkpointer.last is not None and checkpointer.last[0] == 0)
    _busy, frames, folded = checkpointer.last  # type: ignore[misc]
    assert frames > 0 and folded == frames
    # Waiting costs nothing: once a commit that came during the last pause has had its
    # checkpoint too, no write means no checkpoint.
    time.sleep(3 * GATHER_S)
    idle = checkpointer.checkpoints
    time.sleep(5 * GATHER_S)
    assert checkpointer.checkpoints == idle
    thread = checkpointer.thread
    assert thread is not None and thread.is_alive()
    lm.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    # What was written is in the database file, the log gone with the last connection.
    reopened = loadmaster.open(f"sqlite:///{tmp_path / 'lm.db'}")
    try:
        assert len(reopened.hosts.list()) == 21
    finally:
        reopened.close()
