"""End to end: a real server subprocess with the real local engine, driven over HTTP."""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_fixture import CorralServer, logs, start_server, submit_spec, wait_for, wait_state
from tests.server_fixture import get_job as job
from tests.support import require

TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    srv = start_server(tmp_path_factory.mktemp("e2e") / "home")
    try:
        yield srv
    finally:
        srv.stop()


def submit(
    c: httpx.Client, command: str, *, gpus: int = 1, instances: int = 1, retries: int = 0, name: str = "t"
) -> int:
    spec = {
        "name": name,
        "retries": retries,
        "tasks": {"main": {"instances": instances, "command": command, "resources": {"gpus": gpus}}},
    }
    return submit_spec(c, spec)


def test_job_runs_logs_and_succeeds(server: CorralServer) -> None:
    with server.client() as c:
        job_id = submit(c, "echo hello from $CORRAL_JOB_ID; sleep 1; echo bye")
        running = wait_state(c, job_id, ("running", *TERMINAL))
        assert running["state"] == "running", running
        done = wait_state(c, job_id, TERMINAL)
        assert done["state"] == "succeeded", done
        (attempt,) = done["attempts"]
        assert attempt["exit_code"] == 0 and attempt["state"] == "succeeded"
        assert attempt["started_at"] <= attempt["ended_at"]
        assert logs(c, job_id).splitlines() == [f"hello from {job_id}", "bye"]


def test_jobs_run_sandboxed_as_an_unprivileged_user(server: CorralServer) -> None:
    """What the e2e suites claim to test: jobs in the sandbox, not plain processes as root (in
    CI the harness lets no server run them unsandboxed; elsewhere this says when it did)."""
    with server.client() as c:
        (node,) = c.get("/api/v1/nodes").json()
        require(node["labels"]["isolation"] == "on", "job isolation (bubblewrap and cgroups)")
        job_id = submit(c, "id -u", gpus=0)
        assert wait_state(c, job_id, TERMINAL)["state"] == "succeeded"
        assert int(logs(c, job_id)) != 0, "the job ran as root"


def test_gpus_are_free_for_the_next_job_within_a_second(server: CorralServer) -> None:
    with server.client() as c:
        first = submit(c, "sleep 1", gpus=4)
        second = submit(c, "true", gpus=4)
        queued = wait_state(c, second, ("queued",))
        wait_for(lambda: job(c, second)["diagnosis"], 5, what="a diagnosis for the waiting job")
        assert queued["attempts"] == []
        a = wait_state(c, first, TERMINAL)["attempts"][0]
        b = wait_state(c, second, TERMINAL)["attempts"][0]
        assert b["started_at"] - a["ended_at"] < 1.0, (a, b)


def test_failing_job_is_retried_then_fails_keeping_every_attempt(server: CorralServer) -> None:
    with server.client() as c:
        job_id = submit(c, "echo try; exit 3", retries=2)
        done = wait_state(c, job_id, TERMINAL)
        assert done["state"] == "failed"
        assert [(a["number"], a["state"], a["exit_code"]) for a in done["attempts"]] == [
            (1, "failed", 3),
            (2, "failed", 3),
            (3, "failed", 3),
        ]
        assert logs(c, job_id, attempt=1).strip() == "try"


def test_cancel_while_queued_and_while_running(server: CorralServer) -> None:
    with server.client() as c:
        blocker = submit(c, "echo started; sleep 60", gpus=4)
        # Running before the small job arrives: a cycle that saw both would start the 1-GPU job
        # first (the default policy orders by size), and `true` would be over before the cancel.
        wait_state(c, blocker, ("running",))
        waiting = submit(c, "true", gpus=1)
        assert c.post(f"/api/v1/jobs/{waiting}/cancel").status_code == 200
        cancelled = wait_state(c, waiting, TERMINAL)
        assert cancelled["state"] == "cancelled" and cancelled["attempts"] == []
        wait_for(lambda: "started" in logs(c, blocker), 10, what="the blocker's output")
        t0 = time.time()
        assert c.post(f"/api/v1/jobs/{blocker}/cancel").status_code == 200
        done = wait_state(c, blocker, TERMINAL, timeout_s=15)
        assert done["state"] == "cancelled" and time.time() - t0 < 10
        (attempt,) = done["attempts"]
        assert attempt["state"] == "cancelled" and attempt["ended_at"] is not None
        nodes = c.get("/api/v1/nodes").json()
        assert not any(g["allocated"] or g["job_id"] is not None for n in nodes for g in n["gpus"])


RENDEZVOUS = """
import os, socket, sys, time
addr, port, rank = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["RANK"])
e = os.environ
print("RANK=%s WORLD_SIZE=%s INDEX=%s N=%s CVD=%s" % (rank, e["WORLD_SIZE"],
      e["CORRAL_TASK_INDEX"], e["CORRAL_NUM_INSTANCES"], e["CUDA_VISIBLE_DEVICES"]))
if rank == 0:
    s = socket.create_server((addr, port)); s.settimeout(20)
    conn, _ = s.accept(); print("rank 0 got", conn.recv(64).decode())
else:
    for _ in range(200):
        try:
            c = socket.create_connection((addr, port), timeout=1); break
        except OSError:
            time.sleep(0.05)
    c.sendall(b"hello from rank %d" % rank); print("rank 1 sent")
"""


def test_two_instances_gang_start_and_rendezvous(server: CorralServer) -> None:
    with server.client() as c:
        job_id = submit(c, f"{sys.executable} -c '{RENDEZVOUS}'", instances=2, gpus=2)
        done = wait_state(c, job_id, TERMINAL)
        out0, out1 = logs(c, job_id, rank=0), logs(c, job_id, rank=1)
        assert done["state"] == "succeeded", (done, out0, out1)
        assert "RANK=0 WORLD_SIZE=2 INDEX=0 N=2" in out0 and "rank 0 got hello from rank 1" in out0
        assert "RANK=1 WORLD_SIZE=2 INDEX=1 N=2" in out1 and "rank 1 sent" in out1
        (attempt,) = done["attempts"]
        cvd0 = out0.split("CVD=")[1].split()[0].split(",")
        cvd1 = out1.split("CVD=")[1].split()[0].split(",")
        assert len(cvd0) == 2 and len(cvd1) == 2 and not set(cvd0) & set(cvd1)
        by_rank = {p["rank"]: p["gpu_uuids"] for p in attempt["placement"]}
        assert by_rank == {0: cvd0, 1: cvd1}


def test_server_killed_and_restarted_loses_nothing_and_starts_nothing_twice(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home")
    try:
        with srv.client() as c:
            ok = submit(c, "echo once; sleep 2", name="ok")
            bad = submit(c, "sleep 2; exit 7", name="bad")
            long = submit(c, "echo start; sleep 60", name="long")
            for job_id in (ok, bad, long):
                wait_state(c, job_id, ("running",))
        srv.kill()
        time.sleep(3)  # ok and bad end while no server is watching
        srv.start()
        with srv.client() as c:
            done_ok, done_bad = wait_state(c, ok, TERMINAL), wait_state(c, bad, TERMINAL)
            assert done_ok["state"] == "succeeded" and done_ok["attempts"][0]["exit_code"] == 0
            assert done_bad["state"] == "failed" and done_bad["attempts"][0]["exit_code"] == 7
            still = job(c, long)
            assert still["state"] == "running"
            for j in (done_ok, done_bad, still):
                assert len(j["attempts"]) == 1, j
            assert logs(c, long).count("start") == 1
            attempts_dir = srv.home / "engine" / "attempts"
            assert sorted(p.name for p in attempts_dir.iterdir()) == sorted(f"{j}.1" for j in (ok, bad, long))
            c.post(f"/api/v1/jobs/{long}/cancel")
            assert wait_state(c, long, TERMINAL)["state"] == "cancelled"
    finally:
        srv.stop()


def test_a_node_whose_heartbeat_stops_is_down_within_ten_seconds(server: CorralServer) -> None:
    beat = time.time()
    with sqlite3.connect(server.home / "corral.db") as db:  # a node that reported once, then went silent
        db.execute(
            "INSERT INTO nodes (name, cpus, memory_mib, state, admin_state, address, labels, engine,"
            " last_heartbeat, message)"
            " VALUES ('ghost', 8, 8192, 'ready', 'none', '10.9.9.9', '{}', 'local', ?, '')",
            (beat,),
        )
    with server.client() as c:

        def ghost() -> dict[str, Any]:
            return next(n for n in c.get("/api/v1/nodes").json() if n["name"] == "ghost")

        down = wait_for(lambda: (n := ghost())["state"] == "down" and n, 12, 0.1, what="ghost to go down")
        assert time.time() - beat < 10.0
        assert "heartbeat" in down["message"]
        assert next(n for n in c.get("/api/v1/nodes").json() if n["name"] != "ghost")["state"] == "ready"


def test_the_engine_launch_time_is_in_metrics(server: CorralServer) -> None:
    """Every launch the dispatch hands the engine is timed: a histogram per engine in /metrics."""

    def launches(c: httpx.Client) -> tuple[float, float]:
        values = {
            name: float(value)
            for line in c.get("/metrics").text.splitlines()
            if line.startswith("corral_engine_launch_duration_seconds_")
            for name, value in [line.split(" ", 1)]
        }
        count = values.get('corral_engine_launch_duration_seconds_count{engine="local"}', 0.0)
        return count, values.get('corral_engine_launch_duration_seconds_sum{engine="local"}', 0.0)

    with server.client() as c:
        count, total = launches(c)
        job_id = submit(c, "true", gpus=0)
        assert wait_state(c, job_id, TERMINAL)["state"] == "succeeded"
        after_count, after_total = launches(c)
    assert after_count == count + 1, (count, after_count)  # this job's one launch, nothing else ran
    assert 0 < after_total - total < 30, (total, after_total)
