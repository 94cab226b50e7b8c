"""/healthz and /readyz on a real server: ready while the database answers and every loop passes;
503 naming the part that is not (a database that is gone, loops that cannot do their work). The
text of what failed only to an admin or the metrics scrape token: anyone may ask, without a login."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx

from tests.pg import PostgresServer
from tests.server_fixture import start_server, wait_for

CORE_LOOPS = {"nodes", "schedule", "dispatch", "reconcile"}


SCRAPE_TOKEN = "scrape-token-for-readyz"


def readyz(url: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(f"{url}/readyz", timeout=10, headers=headers)
    return r.status_code, r.json()


def without_errors(body: dict[str, Any]) -> bool:
    """No error text anywhere: the names of what is not ready, and numbers, only."""
    return "error" not in body["database"] and all("error" not in loop for loop in body["loops"].values())


def test_readyz_names_loops_that_cannot_work_while_the_database_is_locked(tmp_path: Path) -> None:
    srv = start_server(
        tmp_path / "home",
        extra_env={"CORRAL_READY_LOOP_STALL_S": "1.5", "CORRAL_METRICS_TOKEN": SCRAPE_TOKEN},
    )
    try:
        assert httpx.get(f"{srv.url}/healthz").json() == {"status": "ok"}
        _status, body = wait_for(lambda: (r := readyz(srv.url))[0] == 200 and r, 10, what="ready")
        assert body["ready"] and body["database"]["ok"] and set(body["loops"]) >= CORE_LOOPS
        assert without_errors(body), body
        status, admin = readyz(srv.url, srv.token)  # an admin's token: the error fields, none now
        assert status == 200 and admin["database"]["error"] is None, admin
        assert all(loop["error"] is None for loop in admin["loops"].values()), admin
        # Another process takes SQLite's write lock and keeps it: reads still work (WAL), but the
        # loops cannot write heartbeats, leases or states, so they are not doing their work.
        locker = sqlite3.connect(srv.home / "corral.db", isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            _status, body = wait_for(lambda: (r := readyz(srv.url))[0] == 503 and r, 30, what="not ready")
            assert body["ready"] is False and body["database"]["ok"], body
            stalled = [name for name, loop in body["loops"].items() if not loop["ok"]]
            assert stalled and all(f"loop {name}" in body["not_ready"] for name in stalled)
            assert without_errors(body), body  # no login: which loops, not their exceptions
            _status, scraped = readyz(srv.url, SCRAPE_TOKEN)
            stalled_now = [name for name, loop in scraped["loops"].items() if not loop["ok"]]
            assert stalled_now and all(scraped["loops"][name]["error"] for name in stalled_now), scraped
            assert without_errors(readyz(srv.url, "not-the-scrape-token")[1])
            assert httpx.get(f"{srv.url}/healthz").status_code == 200  # alive, just not ready
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        wait_for(lambda: readyz(srv.url)[0] == 200, 30, what="ready again once the lock is gone")
    finally:
        srv.stop()


def test_readyz_is_503_when_the_database_is_gone(postgres_server: PostgresServer, tmp_path: Path) -> None:
    url = postgres_server.create_database()
    srv = start_server(tmp_path / "home", database_url=url, extra_env={"CORRAL_METRICS_TOKEN": SCRAPE_TOKEN})
    try:
        wait_for(lambda: readyz(srv.url)[0] == 200, 10, what="ready")
        postgres_server.drop_database(url.rsplit("/", 1)[1])
        status, body = readyz(srv.url)
        assert status == 503 and "database" in body["not_ready"], body
        assert body["database"]["ok"] is False and without_errors(body), body  # no host, port, role
        status, scraped = readyz(srv.url, SCRAPE_TOKEN)
        assert status == 503 and scraped["database"]["error"], scraped
        assert "readyz: the database is not ready: " in srv.log_text(), "the error goes to the log"
        assert httpx.get(f"{srv.url}/healthz").status_code == 200
    finally:
        srv.stop()
