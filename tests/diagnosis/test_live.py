"""Failure diagnosis with real job processes on a real server (local engine): an ImportError and a
CUDA OOM message explained by the exit-spec, a GPU Xid under a running job, a two-rank job
deadlocked over a socket, and a node that fails the jobs of three users. One server with short
intervals (CORRAL_DIAG_*, CORRAL_MONITOR_SAMPLE_INTERVAL_S) and an admin exit-spec file. The
node test runs first: the later tests' failures happen on the same node."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_fixture import CorralServer, start_server, submit_spec, wait_for, wait_state
from tests.server_fixture import get_job as job

TERMINAL = ("succeeded", "failed", "cancelled")
ADMIN_RULES = """\
version: 1
rules:
  - reason: node_fault
    category: platform
    log: ['BROKEN-NODE-[0-9]+']
    message: The node broke the job.
    fix: Nothing; the admins look at the node.
    retry: {policy: never}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    base = tmp_path_factory.mktemp("diag-watch")
    rules = base / "exit_spec.yaml"
    rules.write_text(ADMIN_RULES)
    env = {
        "CORRAL_MONITOR_SAMPLE_INTERVAL_S": "0.3",
        "CORRAL_DIAG_INTERVAL_S": "0.3",
        "CORRAL_DIAG_HANG_AFTER_S": "3",
        "CORRAL_DIAG_EXIT_SPEC_FILE": str(rules),
    }
    srv = start_server(base / "home", extra_env=env)
    try:
        yield srv
    finally:
        srv.stop()


def submit(c: httpx.Client, command: str, *, gpus: int = 1, instances: int = 1, **extra: Any) -> int:
    task = {"command": command, "instances": instances, "resources": {"gpus": gpus}}
    return submit_spec(c, {"name": "w", "tasks": {"main": task}, **extra})


def running_gpus(c: httpx.Client, job_id: int, attempt: int) -> list[int]:
    def placed() -> list[int] | None:
        j = job(c, job_id)
        tries = [a for a in j["attempts"] if a["number"] == attempt and a["state"] == "running"]
        return [g["index"] for g in tries[0]["gpus"]] if tries else None

    return list(wait_for(placed, 30, what=f"attempt {attempt} running"))


def user_client(c: httpx.Client, server: CorralServer, name: str) -> httpx.Client:
    r = c.post("/api/v1/users", json={"name": name, "groups": ["default"], "default_group": "default"})
    assert r.status_code == 201, r.text
    token = c.post("/api/v1/tokens", json={"name": "t", "user": name}).json()["token"]
    return server.client(token)


def test_a_node_that_fails_jobs_of_three_users_is_flagged(server: CorralServer) -> None:
    with server.client() as c:
        groups = [g["name"] for g in c.get("/api/v1/groups").json()]
        assert "default" in groups, groups
        for k, name in enumerate(("ana", "bo", "cy")):
            with user_client(c, server, name) as u:
                job_id = submit(u, f"echo BROKEN-NODE-{k}; exit 3", retries=3)
                done = wait_state(u, job_id, TERMINAL)
                assert done["state"] == "failed" and done["attempts"][0]["reason"] == "node_fault", done
            if k < 2:  # not flagged before the third user (the watch runs every 0.3 s)
                time.sleep(1.0)
                assert c.get("/api/v1/nodes").json()[0]["flags"] == [], k
        (flag,) = wait_for(lambda: c.get("/api/v1/nodes").json()[0]["flags"], 10, what="flag")
        assert flag.startswith("failing_jobs: failed jobs of 3 users (ana, bo, cy)")
        assert "failing_jobs" in corral(server, "node", "ls").stdout
        alerts = c.get("/api/v1/alerts").json()["items"]
        assert any(a["name"] == "CorralNodeFailingJobs" and a["status"] == "firing" for a in alerts)


def python(code: str) -> str:
    return f"python3 -c {code!r}"


def test_an_import_error_is_a_user_error_and_not_retried_despite_retries(server: CorralServer) -> None:
    with server.client() as c:
        job_id = submit(c, python("import corral_no_such_module_xyz"), retries=3)
        done = wait_state(c, job_id, TERMINAL, timeout_s=30)
        assert done["state"] == "failed", done
        assert len(done["attempts"]) == 1, "a user error was retried"
        (attempt,) = done["attempts"]
        assert attempt["reason"] == "user_error"
        failure = attempt["failure"]
        assert failure["category"] == "user"
        assert "ModuleNotFoundError" in failure["evidence"]
        assert "Install the missing package" in failure["fix"]
        assert "not retryable: user_error" in done["reason"]


def test_a_cuda_oom_message_gives_reason_cuda_oom_with_the_fix(server: CorralServer) -> None:
    code = (
        "import sys; print('step 1', flush=True); "
        "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', file=sys.stderr); "
        "sys.exit(1)"
    )
    with server.client() as c:
        job_id = submit(c, python(code), retries=2)
        done = wait_state(c, job_id, TERMINAL, timeout_s=30)
        assert done["state"] == "failed", done
        (attempt,) = done["attempts"]
        assert attempt["reason"] == "cuda_oom" and attempt["exit_code"] == 1
        assert attempt["failure"]["category"] == "user"
        assert "batch size" in attempt["failure"]["fix"]
        events = [e["message"] for e in job(c, job_id)["events"] if e["kind"] == "diagnosis"]
        assert any("cuda_oom" in m and "Fix:" in m for m in events), events
        shown = corral(server, "show", str(job_id)).stdout
        assert "attempt 1: cuda_oom (user) The job ran out of GPU memory" in shown, shown
        assert "fix: Lower the batch size" in shown and "log: torch.OutOfMemoryError" in shown, shown
        metrics = c.get("/metrics").text
        assert 'corral_job_failures_total{node="local",reason="cuda_oom"} 1.0' in metrics


def corral(server: CorralServer, *args: str) -> subprocess.CompletedProcess[str]:
    """The `corral` command of this environment, talking to the test server."""
    env = {**os.environ, "CORRAL_URL": server.url, "CORRAL_TOKEN": server.token, "COLUMNS": "200"}
    exe = Path(sys.executable).parent / "corral"
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=60, check=True)


def test_a_gpu_xid_ends_the_attempt_as_gpu_error_and_the_retry_avoids_that_gpu(server: CorralServer) -> None:
    with server.client() as c:
        job_id = submit(c, "sleep 120")
        (bad,) = running_gpus(c, job_id, 1)
        corral(server, "chaos", "gpu", "xid", "local", str(bad), "79", "--home", str(server.home))
        (again,) = running_gpus(c, job_id, 2)
        assert again != bad
        first = job(c, job_id)["attempts"][0]
        assert first["state"] == "failed" and first["reason"] == "gpu_error", first
        assert first["failure"]["category"] == "hardware"
        (node,) = c.get("/api/v1/nodes").json()
        assert node["gpus"][bad]["health"] == "quarantined"
        c.post(f"/api/v1/jobs/{job_id}/cancel")
        wait_state(c, job_id, TERMINAL)


# Rank 0 listens and prints progress for two seconds, rank 1 connects and prints once; then both
# wait for a byte the other never sends: a deadlock, with idle (virtual) GPUs.
DEADLOCK = (
    "import os, socket, time\n"
    "rank, port = int(os.environ['RANK']), int(os.environ['MASTER_PORT'])\n"
    "if rank == 0:\n"
    "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "    s.bind(('0.0.0.0', port)); s.listen(); conn, _ = s.accept()\n"
    "    for i in range(4): print('rank 0 step', i, flush=True); time.sleep(0.5)\n"
    "else:\n"
    "    for _ in range(100):\n"
    "        try: conn = socket.create_connection((os.environ['MASTER_ADDR'], port)); break\n"
    "        except OSError: time.sleep(0.1)\n"
    "    print('rank 1 connected', flush=True)\n"
    "conn.recv(1)\n"
)


def test_two_ranks_blocked_on_each_other_are_a_suspected_hang_naming_the_rank(server: CorralServer) -> None:
    with server.client() as c:
        job_id = submit(c, f"python3 -c {shlex.quote(DEADLOCK)}", instances=2, on_hang="kill", retries=2)
        watch = wait_for(lambda: (job(c, job_id).get("watch") or {}).get("suspected_hang"), 40, what="hang")
        assert watch.startswith("rank 1 on local: its log stopped first"), watch
        done = wait_state(c, job_id, TERMINAL, timeout_s=30)
        assert done["state"] == "failed", done
        (attempt,) = done["attempts"]
        assert attempt["reason"] == "hang_killed"
        events = [e["message"] for e in job(c, job_id)["events"]]
        assert any("suspected hang: rank 1" in m and "on_hang: kill" in m for m in events), events
        alerts = c.get("/api/v1/alerts").json()["items"]
        assert any(
            a["name"] == "CorralJobSuspectedHang" and a["labels"]["job_id"] == str(job_id) for a in alerts
        )
