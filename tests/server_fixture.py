"""Pytest helpers around a REAL Corral server subprocess (see tests/server_harness.py).

    from tests.server_fixture import corral_server, start_server, wait_for   # noqa: F401

    def test_something(corral_server):            # fixture: a fresh server per test, stopped after
        r = corral_server.client().get("/api/v1/nodes")

    def test_other(tmp_path):
        with start_server(tmp_path / "home", extra_env={"CORRAL_X": "1"}) as srv:   # by hand
            srv.url, srv.token, srv.home, srv.pid
            srv.kill(); srv.start()               # SIGKILL and restart on the same home and port

`start_server(home=None, *, database_url=None, virtual_gpus=4, extra_env=None, demo=False,
port=None)` waits until the API answers and the node loop has registered the local node; the
server's output is in `srv.log_text()`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_harness import CorralServer, free_port, start_server

__all__ = [
    "CorralServer",
    "corral_server",
    "free_port",
    "get_job",
    "start_server",
    "submit_spec",
    "wait_for",
    "wait_state",
]


@pytest.fixture
def corral_server(tmp_path: Path) -> Iterator[CorralServer]:
    """A fresh real server (SQLite, 4 virtual GPUs) for one test; stopped afterwards."""
    server = start_server(tmp_path / "corral-home")
    try:
        yield server
    finally:
        server.stop()


def wait_for(
    predicate: Any, timeout_s: float = 20.0, interval_s: float = 0.05, what: str = "condition"
) -> Any:
    """Poll `predicate()` until it returns something truthy; returns it, or fails the test."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def submit_spec(c: httpx.Client, spec: dict[str, Any]) -> int:
    """POST a job spec; the new job's id (fails the test unless the API answered 201)."""
    r = c.post("/api/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def get_job(c: httpx.Client, job_id: int) -> dict[str, Any]:
    r = c.get(f"/api/v1/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def logs(c: httpx.Client, job_id: int, rank: int = 0, attempt: int | None = None) -> str:
    """A rank's log of a job (its latest attempt unless `attempt`) as GET /jobs/{id}/logs gives it."""
    params: dict[str, Any] = {"rank": rank}
    if attempt is not None:
        params["attempt"] = attempt
    r = c.get(f"/api/v1/jobs/{job_id}/logs", params=params)
    assert r.status_code == 200, r.text
    return str(r.json()["data"])


def wait_state(
    c: httpx.Client, job_id: int, states: tuple[str, ...], timeout_s: float = 30
) -> dict[str, Any]:
    """Poll the job until its state is one of `states`; returns the job."""
    return dict(
        wait_for(
            lambda: (j := get_job(c, job_id))["state"] in states and j,
            timeout_s,
            what=f"job {job_id} to reach {states}",
        )
    )


def group_member_clients(
    server: CorralServer, group: str, users: tuple[str, ...]
) -> Iterator[dict[str, Any]]:
    """Body of a fixture: SDK clients for the admin (key "admin") and for `users`, each made a
    member of `group` (created) with it as default group; closed afterwards."""
    from corral.sdk import Client

    admin = Client(server.url, server.token)
    admin.create_group(group)
    made = {"admin": admin}
    for user in users:
        admin.create_user(user, groups=[group], default_group=group)
        made[user] = Client(server.url, admin.create_token(f"{user}-t", user=user)["token"])
    yield made
    for c in made.values():
        c.close()
