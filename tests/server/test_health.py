"""/healthz and /readyz on a real server: ready while the database answers and every loop passes;
503 naming the part that is not (a database that is gone, loops that cannot do their work)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx

from tests.pg import PostgresServer
from tests.server_fixture import start_server, wait_for

CORE_LOOPS = {"nodes", "schedule", "dispatch", "reconcile"}


def readyz(url: str) -> tuple[int, dict[str, Any]]:
    r = httpx.get(f"{url}/readyz", timeout=10)
    return r.status_code, r.json()


def test_readyz_names_loops_that_cannot_work_while_the_database_is_locked(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home", extra_env={"CORRAL_READY_LOOP_STALL_S": "1.5"})
    try:
        assert httpx.get(f"{srv.url}/healthz").json() == {"status": "ok"}
        _status, body = wait_for(lambda: (r := readyz(srv.url))[0] == 200 and r, 10, what="ready")
        assert body["ready"] and body["database"]["ok"] and set(body["loops"]) >= CORE_LOOPS
        # Another process takes SQLite's write lock and keeps it: reads still work (WAL), but the
        # loops cannot write heartbeats, leases or states, so they are not doing their work.
        locker = sqlite3.connect(srv.home / "corral.db", isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            _status, body = wait_for(lambda: (r := readyz(srv.url))[0] == 503 and r, 30, what="not ready")
            assert body["ready"] is False and body["database"]["ok"], body
            stalled = [name for name, loop in body["loops"].items() if not loop["ok"]]
            assert stalled and all(f"loop {name}" in body["not_ready"] for name in stalled)
            assert all(body["loops"][name]["error"] for name in stalled)
            assert httpx.get(f"{srv.url}/healthz").status_code == 200  # alive, just not ready
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        wait_for(lambda: readyz(srv.url)[0] == 200, 30, what="ready again once the lock is gone")
    finally:
        srv.stop()


def test_readyz_is_503_when_the_database_is_gone(postgres_server: PostgresServer, tmp_path: Path) -> None:
    url = postgres_server.create_database()
    srv = start_server(tmp_path / "home", database_url=url)
    try:
        wait_for(lambda: readyz(srv.url)[0] == 200, 10, what="ready")
        postgres_server.drop_database(url.rsplit("/", 1)[1])
        status, body = readyz(srv.url)
        assert status == 503 and "database" in body["not_ready"], body
        assert body["database"]["ok"] is False and body["database"]["error"]
        assert httpx.get(f"{srv.url}/healthz").status_code == 200
    finally:
        srv.stop()
