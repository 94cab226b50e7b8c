"""One writer at a time per SQLite file within a process, handed over at once.

SQLite lets one connection write at a time. When several threads of the API server write at once,
the losers wait in SQLite's busy handler, which sleeps in growing steps (1, 2, 5, 10 ... 100 ms)
and polls: under a burst of submissions most of the latency was that sleeping, not work
(bench/api_load.py: submission p99 600 ms at 200/s; with this lock about 10 times less). Here a
connection takes a process-wide lock for its database file before it starts writing and gives it
back when its transaction ends, so the next writer starts the moment the previous one commits.

The busy handler still arbitrates between processes (two servers on one file, the CLI). A thread
that cannot get the lock within the busy timeout goes on without it and meets SQLite's own lock,
which gives the same "database is locked" error as before instead of a deadlock.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
# Statements that make pysqlite open a write transaction (it begins one implicitly before DML).
WRITE_KEYWORDS = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER", "BEGIN")


def write_lock_for(database: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(database, threading.Lock())


def is_write(sql: str) -> bool:
    return sql.lstrip()[:7].upper().startswith(WRITE_KEYWORDS)


class WriteSerializingConnection(sqlite3.Connection):
    """A pysqlite connection that holds its file's write lock from its first write statement until
    commit, rollback or close. Give as `sqlite3.connect(..., factory=...)` with `lock_wait_s` set
    after connecting (see `configure`)."""

    write_lock: threading.Lock | None = None
    lock_wait_s: float = 10.0
    holds_write_lock: bool = False

    def cursor(self, factory: Any = None) -> Any:
        return super().cursor(factory or WriteSerializingCursor)

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        return self.cursor().execute(sql, parameters)

    def take_write_lock(self) -> None:
        if self.write_lock is None or self.holds_write_lock:
            return
        # Timed out: go on unlocked; SQLite's own lock (and busy handler) still keeps writes safe.
        self.holds_write_lock = self.write_lock.acquire(timeout=self.lock_wait_s)

    def give_back_write_lock(self) -> None:
        if self.holds_write_lock and self.write_lock is not None:
            self.holds_write_lock = False
            self.write_lock.release()

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self.give_back_write_lock()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self.give_back_write_lock()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.give_back_write_lock()


class WriteSerializingCursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        connection = self.connection
        if isinstance(connection, WriteSerializingConnection) and is_write(sql):
            connection.take_write_lock()
        return super().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Any:
        connection = self.connection
        if isinstance(connection, WriteSerializingConnection) and is_write(sql):
            connection.take_write_lock()
        return super().executemany(sql, seq_of_parameters)


def configure(connection: Any, database: str, lock_wait_s: float) -> None:
    """Called on each new connection: bind it to its file's lock."""
    if isinstance(connection, WriteSerializingConnection):
        connection.write_lock = write_lock_for(database)
        connection.lock_wait_s = lock_wait_s
