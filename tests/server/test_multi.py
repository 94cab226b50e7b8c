"""Two server processes on one PostgreSQL database: leases keep them from doing work twice, and
when one dies the other takes its loops over."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.pg import PostgresServer
from tests.server.test_e2e import TERMINAL, job, submit, wait_state
from tests.server_fixture import start_server, wait_for

pytestmark = pytest.mark.postgres


def test_two_servers_on_one_postgres_start_each_job_once(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    url = postgres_server.create_database()
    home = tmp_path / "home"  # shared: both servers' local engines see the same attempt files
    first = start_server(home, database_url=url)
    second = start_server(home, database_url=url, token=first.token)
    try:
        ids = []
        for i in range(12):
            with (first if i % 2 else second).client() as c:
                ids.append(submit(c, "echo run $CORRAL_JOB_ID", gpus=1, name=f"m{i}"))
        with first.client() as c:
            done = [wait_state(c, job_id, TERMINAL) for job_id in ids]
        assert all(j["state"] == "succeeded" and len(j["attempts"]) == 1 for j in done), done
        attempt_dirs = sorted(p.name for p in (home / "engine" / "attempts").iterdir())
        assert attempt_dirs == sorted(f"{job_id}.1" for job_id in ids)
        db = create_engine(url)
        with db.connect() as conn:
            owners: dict[str, str] = {
                r[0]: r[1] for r in conn.execute(text("SELECT name, owner FROM leases"))
            }
        db.dispose()
        assert {"schedule", "dispatch", "reconcile", "nodes"} <= set(owners)
        leader = owners["dispatch"].split(":")[1]
        survivor, victim = (second, first) if int(leader) == first.pid else (first, second)
        victim.kill()  # the loop leader dies without releasing its leases
        killed_at = time.time()
        with survivor.client() as c:
            late = submit(c, "echo after failover", gpus=1, name="late")
            done_late = wait_state(c, late, TERMINAL, timeout_s=30)
            assert done_late["state"] == "succeeded" and len(done_late["attempts"]) == 1
            assert done_late["attempts"][0]["started_at"] - killed_at < 10  # lease TTL is 5 s
            wait_for(lambda: job(c, ids[0])["state"] == "succeeded", 5)
    finally:
        second.stop()
        first.stop()
