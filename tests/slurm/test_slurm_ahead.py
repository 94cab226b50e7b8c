"""Jobs handed to Slurm ahead of a freed slot (server/ahead.py), end to end: a REAL Corral server on
the session's REAL Slurm cluster (3 nodes x 4 CPUs), through Corral's API, checked with squeue and
scontrol. With every node's CPUs held by running jobs, a new job is placed by Corral behind one of
them, submitted, and waits in Slurm (PENDING) while Corral says STARTING; Slurm starts it once that
node's job ends; a job cancelled while it waits there never runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_fixture import CorralServer, start_server, wait_for, wait_state
from tests.server_fixture import get_job as job
from tests.server_fixture import submit_spec as submit
from tests.slurm.conftest import cleanup_cluster
from tests.slurm.harness import SlurmCluster
from tests.slurm.helpers import (
    RUN_THEN_WAIT,
    live_jobs,
    logs,
    release,
    scontrol_job,
    server_env,
    slurm_jobs_of,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def state_dir(slurm_cluster: SlurmCluster) -> Path:
    return slurm_cluster.new_state_dir()


@pytest.fixture(scope="module")
def server(
    slurm_cluster: SlurmCluster, state_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CorralServer]:
    cleanup_cluster(slurm_cluster)  # the cluster is shared with the other Slurm tests of the session
    srv: CorralServer = start_server(
        tmp_path_factory.mktemp("slurm-ahead") / "home",
        extra_env={
            **server_env(slurm_cluster, state_dir),
            "CORRAL_CPU_JOBS_ON_GPU_NODES": "true",  # the harness's nodes all have GPUs
            "CORRAL_SLURM_QUEUE_AHEAD": "1",
        },
    )
    try:
        yield srv
    finally:
        srv.stop()
        cleanup_cluster(slurm_cluster)


@pytest.fixture(scope="module")
def api(server: CorralServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client
        for job_id in live_jobs(client):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
        wait_for(lambda: not live_jobs(client), 30, what="no live Corral job")


def cpu_job(name: str, command: str) -> dict[str, Any]:
    """A job that takes a whole node's 4 CPUs and no GPU."""
    return {
        "name": name,
        "tasks": {"main": {"command": command, "resources": {"cpus": 4, "memory": "64MiB"}}},
    }


def node_of(job_id: int, c: httpx.Client) -> str:
    return str(job(c, job_id)["attempts"][-1]["placement"][0]["node"])


def test_a_job_waits_in_slurm_behind_a_running_one_and_starts_when_its_slot_frees(
    api: httpx.Client, server: CorralServer, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    blockers = [submit(api, cpu_job(f"block-{i}", RUN_THEN_WAIT)) for i in range(3)]
    for b in blockers:
        wait_state(api, b, ("running",), 60)
    by_node = {node_of(b, api): b for b in blockers}
    assert len(by_node) == 3  # one per node: every CPU of the cluster is held

    waiting = submit(api, cpu_job("next", "echo ran next"))
    wait_state(api, waiting, ("starting",), 30)
    node = node_of(waiting, api)
    slurm_job = wait_for(
        lambda: slurm_jobs_of(slurm_cluster, state_dir, waiting, 1), 15, what="its Slurm job"
    )
    assert slurm_job[0]["state"] == "PENDING"  # handed to Slurm, held there until the node frees
    reason = lambda: scontrol_job(slurm_cluster, slurm_job[0]["id"])["Reason"]  # noqa: E731
    wait_for(lambda: reason() == "Resources", 15, what="Slurm to hold it for Resources")
    assert job(api, waiting)["state"] == "starting"
    # and Corral says why (it said nothing: `why` even answered "the scheduler has not looked at
    # it yet"): Slurm's reason on the attempt, for `corral show` and `why`, and in `corral logs`
    held = "Slurm holds it pending: Resources"
    wait_for(lambda: job(api, waiting)["attempts"][-1]["message"] == held, 10, what="Slurm's reason")
    page = api.get(f"/api/v1/jobs/{waiting}/logs", params={"rank": 0}).json()
    assert page["waiting"]["message"] == f"job {waiting} is starting: {held}; no output yet", page

    # A job cancelled while it waits in Slurm is cancelled there and never runs.
    cancelled = submit(api, cpu_job("cancelled", "echo must not run"))
    wait_state(api, cancelled, ("starting",), 30)
    assert api.post(f"/api/v1/jobs/{cancelled}/cancel").status_code in (200, 202)
    wait_state(api, cancelled, ("cancelled",), 30)
    wait_for(
        lambda: [
            j for j in slurm_jobs_of(slurm_cluster, state_dir, cancelled, 1) if j["state"] == "CANCELLED"
        ],
        15,
        what="its Slurm job cancelled",
    )
    assert not (state_dir / "attempts" / f"{cancelled}.1" / "job" / "rank-0.exit").exists()
    assert logs(api, cancelled, 0) == ""

    # Only the node it waits behind matters: the job starts there when that node's job ends.
    release(state_dir, by_node[node], 1)
    try:
        done = wait_state(api, waiting, ("succeeded", "failed"), 60)
    except pytest.fail.Exception:  # seen once in a full run, never alone: say what each side held
        pytest.fail(
            f"job {waiting} did not end after its slot freed: Corral {job(api, waiting)}; "
            f"Slurm: it {slurm_jobs_of(slurm_cluster, state_dir, waiting, 1)}, "
            f"its blocker {slurm_jobs_of(slurm_cluster, state_dir, by_node[node], 1)}; "
            f"server log tail:\n{server.log_text()[-6000:]}"
        )
    assert done["state"] == "succeeded", done
    assert logs(api, waiting, 0).strip() == "ran next"
    blocker = slurm_jobs_of(slurm_cluster, state_dir, by_node[node], 1)[0]
    blocker_end = scontrol_job(slurm_cluster, blocker["id"])["EndTime"]
    assert scontrol_job(slurm_cluster, slurm_job[0]["id"])["StartTime"] >= blocker_end  # ISO times
    for b in blockers:
        release(state_dir, b, 1)
