"""SQLite writers in one process take turns on a lock (corral.db.sqlite_writes) instead of
polling SQLite's busy handler; the lock is given back however the transaction ends."""

from __future__ import annotations

import threading
import time
from pathlib import Path

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


def test_second_writer_waits_for_the_first_and_starts_right_after_its_commit(tmp_path: Path) -> None:
    engine = make_table(tmp_path)
    first_wrote = threading.Event()
    committed_at: list[float] = []
    second_wrote_at: list[float] = []
    errors: list[BaseException] = []

    def first() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("INSERT INTO t VALUES ('first', 0)"))
            first_wrote.set()
            time.sleep(0.3)  # hold the write transaction open
            conn.commit()
            committed_at.append(time.monotonic())

    def second() -> None:
        first_wrote.wait(5)
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("INSERT INTO t VALUES ('second', 0)"))
                second_wrote_at.append(time.monotonic())
                conn.commit()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    # The second write ran after the first commit, and promptly (SQLite's busy handler alone
    # sleeps in steps of up to 100 ms between polls).
    assert committed_at and second_wrote_at
    assert second_wrote_at[0] >= committed_at[0] - 0.005
    assert second_wrote_at[0] - committed_at[0] < 0.05
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


def test_a_writer_that_cannot_get_the_lock_in_time_meets_sqlites_own_lock(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    engine = make_table(tmp_path)
    holder = engine.connect()
    holder.execute(sa.text("INSERT INTO t VALUES ('holder', 0)"))
    # A second engine on the same file with short waits: both the lock and SQLite time out.
    impatient = make_engine(f"sqlite:///{path}")
    with impatient.connect() as conn:
        raw(conn).lock_wait_s = 0.2
        conn.exec_driver_sql("PRAGMA busy_timeout=200")
        started = time.monotonic()
        try:
            conn.execute(sa.text("INSERT INTO t VALUES ('late', 0)"))
            raised = False
        except sa.exc.OperationalError as exc:
            raised = "locked" in str(exc)
        assert raised
        assert time.monotonic() - started < 2
        assert not raw(conn).holds_write_lock
    holder.rollback()
    holder.close()
    impatient.dispose()
    engine.dispose()
