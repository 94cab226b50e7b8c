"""SQLite writers in one process take turns on a lock (corral.db.sqlite_writes) instead of
polling SQLite's busy handler; the lock is given back however the transaction ends."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.db import sqlite_writes
from corral.db.session import make_engine


def make_table(tmp_path: Path) -> sa.Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (who TEXT, at REAL)"))
    return engine


def raw(conn: sa.Connection) -> sqlite_writes.WriteSerializingConnection:
    dbapi = conn.connection.dbapi_connection
    assert isinstance(dbapi, sqlite_writes.WriteSerializingConnection)
    return dbapi


def test_lock_is_held_from_first_write_until_commit_or_rollback(tmp_path: Path) -> None:
    engine = make_table(tmp_path)
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT count(*) FROM t"))
        assert not raw(conn).holds_write_lock  # reads take nothing
        conn.execute(sa.text("INSERT INTO t VALUES ('a', 0)"))
        assert raw(conn).holds_write_lock
        conn.commit()
        assert not raw(conn).holds_write_lock
        conn.execute(sa.text("UPDATE t SET at = 1"))
        assert raw(conn).holds_write_lock
        conn.rollback()
        assert not raw(conn).holds_write_lock
        assert conn.execute(sa.text("SELECT at FROM t")).scalar_one() == 0
    lock = sqlite_writes.write_lock_for(str((tmp_path / "w.db").resolve()))
    assert lock.acquire(blocking=False)  # nobody kept it
    lock.release()
    engine.dispose()


class WatchedLock:
    """A file's write lock that says when a writer waits for it and notes each wait's timeout. A
    wait without a bound (a writer that could deadlock) fails at once instead of hanging."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waiting = threading.Event()
        self.timeouts: list[float] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        if not blocking:
            return False
        self.timeouts.append(timeout)
        assert 0 <= timeout <= 60, f"a writer waits for the lock without a bound: {timeout}"
        self.waiting.set()
        return self._lock.acquire(timeout=timeout)

    def release(self) -> None:
        self._lock.release()


def watched_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WatchedLock:
    """Installed as w.db's lock before any engine binds to the file."""
    lock = WatchedLock()
    monkeypatch.setitem(sqlite_writes._locks, str((tmp_path / "w.db").resolve()), lock)
    return lock


def test_second_writer_waits_for_the_first_and_starts_right_after_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second writer has no busy handler at all (busy_timeout 0: SQLite refuses a write at once
    while another is open), so its write can only succeed by waiting on the lock, which hands over
    on the first's commit: no polling, whatever the machine's speed."""
    lock = watched_lock(tmp_path, monkeypatch)
    engine = make_table(tmp_path)
    first_wrote, second_ended = threading.Event(), threading.Event()
    order: list[str] = []
    errors: list[BaseException] = []

    def first() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("INSERT INTO t VALUES ('first', 0)"))
            first_wrote.set()
            # hold the write transaction open until the second writer waits for the lock (or failed)
            deadline = time.monotonic() + 30
            while not (lock.waiting.is_set() or second_ended.is_set()):
                assert time.monotonic() < deadline, "the second writer neither waited nor ended"
                lock.waiting.wait(0.01)
            order.append("first commits")
            conn.commit()

    def second() -> None:
        try:
            assert first_wrote.wait(30)
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA busy_timeout=0")
                conn.execute(sa.text("INSERT INTO t VALUES ('second', 0)"))
                order.append("second wrote")
                conn.commit()
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            second_ended.set()

    lock.waiting.clear()  # make_table's own write did not wait
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert lock.waiting.is_set() and lock.timeouts == [sqlite_writes.WriteSerializingConnection.lock_wait_s]
    assert order == ["first commits", "second wrote"]
    with engine.connect() as conn:
        assert sorted(conn.execute(sa.text("SELECT who FROM t")).scalars()) == ["first", "second"]
    engine.dispose()


def test_closing_a_connection_mid_write_gives_the_lock_back(tmp_path: Path) -> None:
    engine = make_table(tmp_path)
    conn = engine.connect()
    conn.execute(sa.text("INSERT INTO t VALUES ('x', 0)"))
    assert raw(conn).holds_write_lock
    conn.invalidate()  # closes the DBAPI connection without a commit
    conn.close()
    with engine.connect() as other:
        other.execute(sa.text("INSERT INTO t VALUES ('y', 0)"))
        other.commit()
        assert list(other.execute(sa.text("SELECT who FROM t")).scalars()) == ["y"]
    engine.dispose()


def test_a_writer_that_cannot_get_the_lock_in_time_meets_sqlites_own_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.db"
    lock = watched_lock(tmp_path, monkeypatch)
    engine = make_table(tmp_path)
    holder = engine.connect()
    holder.execute(sa.text("INSERT INTO t VALUES ('holder', 0)"))
    # A second engine on the same file with short waits: both the lock and SQLite time out.
    impatient = make_engine(f"sqlite:///{path}")
    with impatient.connect() as conn:
        raw(conn).lock_wait_s = 0.2
        conn.exec_driver_sql("PRAGMA busy_timeout=200")
        try:
            conn.execute(sa.text("INSERT INTO t VALUES ('late', 0)"))
            raised = False
        except sa.exc.OperationalError as exc:
            raised = "locked" in str(exc)
        assert raised
        assert lock.timeouts == [0.2]  # waited its own 0.2 s for the lock, then SQLite's 200 ms
        assert not raw(conn).holds_write_lock
    holder.rollback()
    holder.close()
    impatient.dispose()
    engine.dispose()
