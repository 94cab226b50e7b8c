"""Quotas on a running server (real local engine, 4 virtual GPUs): a group held at its max waits
with the reason while GPUs are free, a group at its CPU limit waits likewise, and a group's
guarantee takes back GPUs another group borrowed, by preemption."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from tests.server_fixture import CorralServer, get_job, start_server, submit_spec, wait_for, wait_state

TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    srv = start_server(tmp_path_factory.mktemp("quota-live") / "home")
    try:
        yield srv
    finally:
        srv.stop()


def make_group(c: httpx.Client, name: str, **fields: Any) -> None:
    r = c.post("/api/v1/groups", json={"name": name, **fields})
    assert r.status_code == 201, r.text


def submit(c: httpx.Client, group: str, *, gpus: int = 0, cpus: float = 0.25, name: str = "q") -> int:
    """A job that sleeps until it is stopped (SIGTERM ends `sleep` at once; stop_grace is short)."""
    resources = {"gpus": gpus, "cpus": cpus, "memory": "64MiB"}
    spec = {"name": name, "group": group, "stop_grace": "1s", "command": "sleep 60", "resources": resources}
    return submit_spec(c, spec)


def diagnosis_code(c: httpx.Client, job_id: int) -> str | None:
    diagnosis = get_job(c, job_id)["diagnosis"]
    return diagnosis["reasons"][0]["code"] if diagnosis and diagnosis["reasons"] else None


def free_gpus(c: httpx.Client) -> int:
    return sum(not g["allocated"] for n in c.get("/api/v1/nodes").json() for g in n["gpus"])


def cancel_all(c: httpx.Client, *job_ids: int) -> None:
    for job_id in job_ids:
        c.post(f"/api/v1/jobs/{job_id}/cancel")
    for job_id in job_ids:
        wait_state(c, job_id, TERMINAL, timeout_s=15)
    wait_for(lambda: free_gpus(c) == 4, 10, what="every GPU to be free again")


def corral_show(server: CorralServer, job_id: int) -> str:
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.token}
    result = CliRunner().invoke(cli, ["show", str(job_id)], env=env)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_group_held_at_its_max_waits_with_the_reason_while_gpus_are_free(server: CorralServer) -> None:
    with server.client() as c:
        make_group(c, "capped", quotas=[{"gpu_model": "*", "guaranteed": 0, "max": 2}])
        first = submit(c, "capped", gpus=2, name="first")
        wait_state(c, first, ("running",))
        second = submit(c, "capped", gpus=1, name="second")
        wait_for(lambda: diagnosis_code(c, second) == "quota_max", 10, what="the quota_max diagnosis")
        assert get_job(c, second)["state"] == "queued" and free_gpus(c) == 2
        shown = corral_show(server, second)
        flat = " ".join(shown.split())
        assert "why pending: waits for group capped's maximum quota: needs 1 GPU, 0 free in its" in flat
        assert "quota_max" in flat and "estimated start: none while it is held back" in flat
        group = c.get("/api/v1/groups/capped").json()
        assert group["usage"]["gpus"] == [
            {"gpu_model": "*", "used": 2, "borrowed": 2, "guaranteed": 0, "max": 2, "models": {"VGPU": 2}}
        ]
        c.post(f"/api/v1/jobs/{first}/cancel")
        wait_state(c, second, ("running",), timeout_s=15)  # within the max again once it ends
        cancel_all(c, first, second)


def test_a_group_at_its_cpu_max_waits_with_the_reason(server: CorralServer) -> None:
    with server.client() as c:
        make_group(c, "cpu-capped", cpus_max=0.5)
        first = submit(c, "cpu-capped", cpus=0.5, name="first")
        wait_state(c, first, ("running",))
        second = submit(c, "cpu-capped", cpus=0.25, name="second")
        wait_for(lambda: diagnosis_code(c, second) == "cpu_quota", 10, what="the cpu_quota diagnosis")
        (reason,) = get_job(c, second)["diagnosis"]["reasons"]
        assert reason["message"] == "group cpu-capped may hold 0.5 CPUs; it holds 0.5; this job needs 0.25"
        assert "(cpu_quota, quota:cpu_memory)" in corral_show(server, second)
        too_big = c.post(
            "/api/v1/jobs",
            json={"name": "big", "group": "cpu-capped", "command": "true", "resources": {"cpus": 1}},
        )
        assert too_big.status_code == 422 and "may hold at most 0.5 CPUs" in too_big.text
        cancel_all(c, first, second)


def test_a_guarantee_takes_back_gpus_another_group_borrowed(server: CorralServer) -> None:
    with server.client() as c:
        make_group(c, "owner", quotas=[{"gpu_model": "*", "guaranteed": 4, "max": 4}])
        make_group(c, "borrower")
        borrowing = submit(c, "borrower", gpus=4, name="borrowing")
        running = wait_state(c, borrowing, ("running",))
        assert running["attempts"][0]["borrowed"] is True  # nothing guaranteed: all borrowed
        owned = submit(c, "owner", gpus=2, name="owned")
        started = wait_state(c, owned, ("running", *TERMINAL), timeout_s=20)
        assert started["state"] == "running", started
        victim = get_job(c, borrowing)
        assert victim["attempts"][0]["state"] == "preempted", victim
        assert victim["state"] in ("queued", "preempted"), victim  # back in the queue, not lost
        events = c.get(f"/api/v1/jobs/{borrowing}/events").json()
        assert any("owner" in e["message"] for e in events), events  # says who reclaimed it
        cancel_all(c, borrowing, owned)
