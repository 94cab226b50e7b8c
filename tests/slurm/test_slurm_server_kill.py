"""SIGKILL of the Corral server on the Slurm engine, then a restart: no job runs twice, none is
lost, no log line goes (docs/slurm.md "Stop, adopt, faults"). A REAL server subprocess over the
session's REAL Slurm cluster, killed at three moments:

- between its `sbatch` and recording the launch: slurmctld is paused (SIGSTOP) so that the
  server's sbatch waits on it; the server is killed with the request in flight, slurmctld resumed
  (it takes the orphaned request: Slurm has a job Corral never recorded), the server restarted;
- while jobs run (a two-rank gang and a single): each prints before and after the restart;
- while a cancel is in flight: the server's scancel waits on the paused slurmctld when it is
  killed; the restarted server must still stop the job, and run it no more; and, for a job that
  ignores SIGTERM, after the TERM went out and before the grace's KILL (whose timer dies with
  the server): the restarted server sends the KILL.

Each instance appends one line (node, rank, Slurm job) to its /job/runs.txt, so a second run of
it shows as a second line, and prints what it did to its log."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.server_fixture import CorralServer, start_server, wait_for, wait_state
from tests.server_fixture import get_job as job
from tests.server_fixture import submit_spec as submit
from tests.slurm.conftest import cleanup_cluster
from tests.slurm.harness import SlurmCluster
from tests.slurm.helpers import LIVE, TERMINAL, gang_spec, logs, release, runs_of, server_env, slurm_jobs_of

pytestmark = pytest.mark.slurm

# Prints a line, notes the run, waits for the test's release file, prints a last line.
RUN_LOGGED = (
    'echo "begin rank $RANK"; echo "$(hostname) $RANK $SLURM_JOB_ID" >> /job/runs.txt; '
    'while [ ! -e /job/release ]; do sleep 0.1; done; echo "end rank $RANK"'
)


@pytest.fixture(scope="module")
def state_dir(slurm_cluster: SlurmCluster) -> Path:
    return slurm_cluster.new_state_dir()


@pytest.fixture(scope="module")
def server(
    slurm_cluster: SlurmCluster, state_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CorralServer]:
    cleanup_cluster(slurm_cluster)  # the cluster is shared with the session's other tests
    srv = start_server(
        tmp_path_factory.mktemp("slurm-kill") / "home",
        extra_env={
            **server_env(slurm_cluster, state_dir),
        },
    )
    try:
        yield srv
    finally:
        slurm_cluster.resume_controller()
        srv.stop()
        cleanup_cluster(slurm_cluster)


@pytest.fixture
def api(server: CorralServer, slurm_cluster: SlurmCluster) -> Iterator[httpx.Client]:
    """An admin client; afterwards slurmctld runs, the server serves and no live job is left."""
    with server.client() as client:
        try:
            yield client
        finally:
            slurm_cluster.resume_controller()
            if server.proc is None or server.proc.poll() is not None:
                server.start()
            for item in client.get("/api/v1/jobs", params={"limit": 500}).json()["items"]:
                if item["state"] in LIVE:
                    client.post(f"/api/v1/jobs/{item['id']}/cancel")
            cleanup_cluster(slurm_cluster)


def server_children(server: CorralServer, tool: str) -> list[int]:
    """PIDs of the server's child processes running the Slurm command `tool`."""
    assert server.proc is not None
    try:
        children = psutil.Process(server.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if child.name() == tool:
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def log_lines(api: httpx.Client, job_id: int, rank: int, attempt: int | None = None) -> list[str]:
    return logs(api, job_id, rank, attempt).splitlines()


def slurm_ids_in(runs: list[str]) -> list[str]:
    return [line.split()[2] for line in runs]


def wait_slurm_job_ended(cluster: SlurmCluster, state_dir: Path, job_id: int) -> dict[str, str]:
    """The one Slurm job of the job's first attempt, once Slurm says it ended."""

    def ended() -> dict[str, str] | None:
        (slurm_job,) = slurm_jobs_of(cluster, state_dir, job_id, 1)  # one submission
        return slurm_job if slurm_job["state"] not in ("PENDING", "RUNNING", "COMPLETING") else None

    return dict(wait_for(ended, 30, what=f"the Slurm job of job {job_id} ended"))


def test_server_killed_between_sbatch_and_recording_runs_the_job_once(
    api: httpx.Client, server: CorralServer, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    slurm_cluster.pause_controller()
    try:
        job_id = submit(api, gang_spec("lost-launch", RUN_LOGGED, instances=1, gpus=1))
        wait_for(lambda: server_children(server, "sbatch"), 30, what="the server's sbatch in flight")
        assert job(api, job_id)["state"] == "scheduled"  # the launch is not recorded
        server.kill()
    finally:
        slurm_cluster.resume_controller()  # the orphaned sbatch's request reaches slurmctld now
    server.start()
    wait_for(lambda: runs_of(state_dir, job_id, 1), 60, what="the job's run")
    time.sleep(3)  # a second run, if any, would have started by now
    release(state_dir, job_id, 1)
    done = wait_state(api, job_id, TERMINAL, timeout_s=60)
    assert done["state"] == "succeeded" and len(done["attempts"]) == 1, done
    runs = runs_of(state_dir, job_id, 1)
    assert len(runs) == 1, runs  # one run, whichever submission it was
    assert log_lines(api, job_id, 0) == ["begin rank 0", "end rank 0"]
    # every Slurm job of the attempt (the orphaned submission and a relaunch's, if any) ended,
    # and only the one that ran is the attempt's
    submitted = slurm_jobs_of(slurm_cluster, state_dir, job_id, 1)
    assert submitted and all(j["state"] not in ("PENDING", "RUNNING") for j in submitted), submitted
    assert slurm_ids_in(runs)[0] in {j["id"] for j in submitted}, (runs, submitted)


def test_server_killed_while_jobs_run_keeps_them_and_their_logs(
    api: httpx.Client, server: CorralServer, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    gang = submit(api, gang_spec("gang", RUN_LOGGED, instances=2, gpus=1))
    single = submit(api, gang_spec("single", RUN_LOGGED, instances=1, gpus=2))
    ranks = {gang: 2, single: 1}
    for job_id, n in ranks.items():
        wait_state(api, job_id, ("running", *TERMINAL), timeout_s=60)
        wait_for(lambda j=job_id, n=n: len(runs_of(state_dir, j, 1, n)) == n, 30, what=f"job {job_id} runs")
    server.kill()
    server.start()
    for job_id, n in ranks.items():
        assert job(api, job_id)["state"] == "running"
        release(state_dir, job_id, 1, n)
    for job_id, n in ranks.items():
        done = wait_state(api, job_id, TERMINAL, timeout_s=60)
        assert done["state"] == "succeeded" and len(done["attempts"]) == 1, done
        runs = runs_of(state_dir, job_id, 1, n)
        assert len(runs) == n and len(set(slurm_ids_in(runs))) == 1, runs  # each rank once, one job
        for rank in range(n):
            assert log_lines(api, job_id, rank) == [f"begin rank {rank}", f"end rank {rank}"]


def test_server_killed_with_a_cancel_in_flight_still_cancels(
    api: httpx.Client, server: CorralServer, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    job_id = submit(api, gang_spec("cancel", RUN_LOGGED, instances=1, gpus=1, stop_grace="2s"))
    wait_state(api, job_id, ("running", *TERMINAL), timeout_s=60)
    wait_for(lambda: runs_of(state_dir, job_id, 1), 30, what="the job's run")
    slurm_cluster.pause_controller()
    try:
        r = api.post(f"/api/v1/jobs/{job_id}/cancel")
        assert r.status_code == 200, r.text
        wait_for(lambda: server_children(server, "scancel"), 30, what="the server's scancel in flight")
        server.kill()
    finally:
        slurm_cluster.resume_controller()
    server.start()
    done: dict[str, Any] = wait_state(api, job_id, TERMINAL, timeout_s=60)
    assert done["state"] == "cancelled" and len(done["attempts"]) == 1, done

    slurm_job = wait_slurm_job_ended(slurm_cluster, state_dir, job_id)
    runs = runs_of(state_dir, job_id, 1)
    assert len(runs) == 1 and slurm_ids_in(runs) == [slurm_job["id"]], runs
    assert log_lines(api, job_id, 0)[:1] == ["begin rank 0"]  # what it printed before the cancel
    time.sleep(2)
    assert len(runs_of(state_dir, job_id, 1)) == 1  # not run again after the restart


def test_server_killed_within_a_stops_grace_still_kills_the_job(
    api: httpx.Client, server: CorralServer, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    """The job ignores SIGTERM; the server sent the cancel's TERM and is killed before the grace
    ran out (its kill timer dies with it): the restarted server must still send the KILL once
    the deadline in attempt.json has passed."""
    command = "trap 'echo \"TERM ignored\"' TERM; " + RUN_LOGGED
    job_id = submit(api, gang_spec("grace", command, instances=1, gpus=1, stop_grace="6s"))
    wait_state(api, job_id, ("running", *TERMINAL), timeout_s=60)
    wait_for(lambda: runs_of(state_dir, job_id, 1), 30, what="the job's run")
    assert api.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    wait_for(lambda: "TERM ignored" in log_lines(api, job_id, 0), 30, what="the TERM delivered")
    server.kill()
    (slurm_job,) = slurm_jobs_of(slurm_cluster, state_dir, job_id, 1)
    assert slurm_job["state"] == "RUNNING", slurm_job  # alive past the TERM: only a KILL ends it
    server.start()
    done = wait_state(api, job_id, TERMINAL, timeout_s=60)
    assert done["state"] == "cancelled" and len(done["attempts"]) == 1, done
    wait_slurm_job_ended(slurm_cluster, state_dir, job_id)
    assert len(runs_of(state_dir, job_id, 1)) == 1
    assert log_lines(api, job_id, 0)[0] == "begin rank 0"
