"""End to end on Slurm: a REAL Corral server subprocess (`CORRAL_ENGINE=slurm`) over the REAL Slurm
cluster of the session fixture (munged, slurmctld, three `slurmd -N nodeX` with four fake GPUs each),
driven only through Corral's REST API, checked against Slurm's own tools (sinfo, squeue, scontrol).

What is shown: nodes and GPUs discovered from Slurm; a 2-instance x 2-GPU gang placed by Corral on
two named nodes and run there by Slurm with Corral's rendezvous variables; two instances sharing a
node get disjoint devices; cordon/uncordon in Corral <-> DRAIN/resume in Slurm; a node crash under a
job with retries is detected, the job reruns on another node, and nothing runs twice; a server
killed and restarted re-adopts its running Slurm job; a slurmctld outage turns nodes unknown,
fails nothing, holds new jobs queued, and everything recovers when slurmctld is back.

The crash and outage tests print their timings (`pytest -s`).
"""

from __future__ import annotations

import pwd
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
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster
from tests.slurm.helpers import (
    LIVE,
    RUN_THEN_WAIT,
    TERMINAL,
    gang_spec,
    live_jobs,
    logs,
    release,
    runs_of,
    scontrol_job,
    server_env,
    slurm,
    slurm_jobs_of,
)

pytestmark = pytest.mark.slurm

DB_PASSWORD = "pg-secret-5f1e9c"
# Printed by every instance and read back through the logs API.
SHOW_ENV = (
    "echo HOST=$(hostname); echo UID=$(id -u); "
    "for v in CUDA_VISIBLE_DEVICES CORRAL_SLURM_GPUS MASTER_ADDR MASTER_PORT WORLD_SIZE RANK CORRAL_JOB_ID "
    "CORRAL_TASK_ROLE CORRAL_TASK_INDEX CORRAL_NUM_INSTANCES SLURM_JOB_ID; do eval echo $v=\\$$v; done"
)


# ---- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def state_dir(slurm_cluster: SlurmCluster) -> Path:
    """The server's CORRAL_SLURM_STATE_DIR: job dirs live at <state>/attempts/<job>.<n>/job."""
    return slurm_cluster.new_state_dir()


@pytest.fixture(scope="module")
def server(
    slurm_cluster: SlurmCluster, state_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CorralServer]:
    cleanup_cluster(slurm_cluster)  # the cluster is shared with the engine tests of the session
    srv = start_server(
        tmp_path_factory.mktemp("slurm-e2e") / "home",
        extra_env={
            **server_env(slurm_cluster, state_dir),
            "PGPASSWORD": DB_PASSWORD,  # a database password in the server's environment
        },
    )
    try:
        yield srv
    finally:
        srv.stop()
        cleanup_cluster(slurm_cluster)


@pytest.fixture
def api(server: CorralServer, slurm_cluster: SlurmCluster) -> Iterator[httpx.Client]:
    """An admin client; afterwards no live job is left and every node is ready again in both
    Slurm and Corral (a test that crashed or drained a node leaves the next one a clean cluster)."""
    with server.client() as client:
        yield client
        for item in client.get("/api/v1/jobs", params={"limit": 500}).json()["items"]:
            if item["state"] in LIVE:
                client.post(f"/api/v1/jobs/{item['id']}/cancel")
        for name in slurm_cluster.node_names:
            client.post(f"/api/v1/nodes/{name}/uncordon")
        wait_for(lambda: not live_jobs(client), 30, what="no live Corral job")
        cleanup_cluster(slurm_cluster)
        wait_for(lambda: all_ready(client, slurm_cluster), 30, what="every node ready in Corral")


# ---- API helpers ---------------------------------------------------------------------------------
def nodes_by_name(c: httpx.Client) -> dict[str, dict[str, Any]]:
    r = c.get("/api/v1/nodes")
    assert r.status_code == 200, r.text
    return {n["name"]: n for n in r.json()}


def all_ready(c: httpx.Client, cluster: SlurmCluster) -> bool:
    nodes = nodes_by_name(c)
    return all(nodes.get(n, {}).get("state") == "ready" for n in cluster.node_names)


def wait_state_where(c: httpx.Client, job_id: int, check: Any, timeout_s: float) -> dict[str, Any]:
    return dict(
        wait_for(lambda: check(j := job(c, job_id)) and j, timeout_s, interval_s=0.1, what=f"job {job_id}")
    )


def printed_vars(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


# ---- Slurm helpers -------------------------------------------------------------------------------
def sinfo_state(cluster: SlurmCluster, node: str) -> str:
    return slurm(cluster, "sinfo", "-h", "-n", node, "-N", "-o", "%T").strip()


# ---- tests ---------------------------------------------------------------------------------------
def test_nodes_and_gpus_come_from_slurm(api: httpx.Client, slurm_cluster: SlurmCluster) -> None:
    nodes = nodes_by_name(api)
    assert set(nodes) == set(slurm_cluster.node_names), nodes.keys()  # no local node: Slurm's only
    for name in slurm_cluster.node_names:
        node = nodes[name]
        assert node["engine"] == "slurm" and node["state"] == "ready", node
        assert node["cpus"] == slurm_cluster.cpus_per_node and node["memory_mib"] == slurm_cluster.memory_mib
        assert node["address"] == "127.0.0.1"  # NodeAddr: what MASTER_ADDR will be
        assert [g["index"] for g in node["gpus"]] == list(range(slurm_cluster.gpus_per_node))
        assert {g["model"].lower() for g in node["gpus"]} == {slurm_cluster.gpu_type}
        assert len({g["uuid"] for g in node["gpus"]}) == slurm_cluster.gpus_per_node
        assert all(g["job_id"] is None for g in node["gpus"])


def test_gang_placed_on_two_nodes_runs_under_slurm(
    api: httpx.Client, state_dir: Path, slurm_cluster: SlurmCluster
) -> None:
    # 3 of a node's 4 CPUs per instance: Corral's scheduler must spread the gang over two nodes.
    job_id = submit(api, gang_spec("gang", SHOW_ENV, instances=2, gpus=2, cpus=3))
    done = wait_state(api, job_id, TERMINAL)
    assert done["state"] == "succeeded", done
    (attempt,) = done["attempts"]
    placement = sorted(attempt["placement"], key=lambda p: p["rank"])
    placed_nodes = [p["node"] for p in placement]
    assert len(set(placed_nodes)) == 2 and set(placed_nodes) <= set(slurm_cluster.node_names), placement

    # Slurm ran ONE job for the gang, on exactly the nodes Corral chose.
    (slurm_job,) = slurm_jobs_of(slurm_cluster, state_dir, job_id, 1)
    assert slurm_job["state"] == "COMPLETED" and set(slurm_job["nodes"].split(",")) == set(placed_nodes)

    seen = [printed_vars(logs(api, job_id, rank)) for rank in (0, 1)]
    for rank, (place, env) in enumerate(zip(placement, seen, strict=True)):
        assert env["HOST"] == place["node"], (place, env)  # ran on the slurmd of the placed node
        # two GPUs chosen by Slurm, numbered from 0 for CUDA as under ConstrainDevices
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and len(env["CORRAL_SLURM_GPUS"].split(",")) == 2
        assert int(env["UID"]) == pwd.getpwnam(TEST_ACCOUNTS["admin"]).pw_uid  # the job's user's own
        assert env["RANK"] == str(rank) and env["CORRAL_TASK_INDEX"] == str(rank)
        assert env["WORLD_SIZE"] == "2" and env["CORRAL_NUM_INSTANCES"] == "2"
        assert env["CORRAL_JOB_ID"] == str(job_id) and env["CORRAL_TASK_ROLE"] == "main"
        assert env["SLURM_JOB_ID"] == slurm_job["id"]
    rank0_node = nodes_by_name(api)[placement[0]["node"]]
    assert {e["MASTER_ADDR"] for e in seen} == {rank0_node["address"]}
    assert len({e["MASTER_PORT"] for e in seen}) == 1 and int(seen[0]["MASTER_PORT"]) > 0


def test_instances_sharing_a_node_get_disjoint_gpus(api: httpx.Client, server: CorralServer) -> None:
    job_id = submit(api, gang_spec("packed", SHOW_ENV, instances=2, gpus=2))
    done = wait_state(api, job_id, TERMINAL)
    assert done["state"] == "succeeded", done
    placement = sorted(done["attempts"][0]["placement"], key=lambda p: p["rank"])
    envs = [printed_vars(logs(api, job_id, rank)) for rank in (0, 1)]
    # each instance got its own two of the GPUs Slurm allocated on the node
    devices = [set(e["CORRAL_SLURM_GPUS"].split(",")) for e in envs]
    assert all(len(d) == 2 for d in devices) and not devices[0] & devices[1], devices
    for place, env in zip(placement, envs, strict=True):
        assert env["HOST"] == place["node"] and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    # Corral packs a gang onto the nodes it already uses first (scheduler/placement.py): one node,
    # one Slurm job, two instances side by side on it.
    assert placement[0]["node"] == placement[1]["node"], placement
    assert envs[0]["SLURM_JOB_ID"] == envs[1]["SLURM_JOB_ID"]


def test_a_job_cannot_read_the_servers_secrets(
    api: httpx.Client, server: CorralServer, state_dir: Path
) -> None:
    """The real server's home (config.yaml with the admin token, the database, the log), the
    engine's own records and the server's environment (a database password) from inside a job."""
    home = server.home
    reader = (
        f"cat {home}/config.yaml {home}/corral.db {home}/server.log; ls {home}; "
        f"cat {state_dir}/attempts/*/attempt.json; env; echo finished"
    )
    job_id = submit(api, gang_spec("reader", reader, instances=1, gpus=1))
    assert wait_state(api, job_id, TERMINAL)["state"] == "succeeded"
    out = logs(api, job_id, 0)
    assert "finished" in out and f"CORRAL_JOB_ID={job_id}" in out, out  # it ran and printed its env
    assert server.token and (home / "config.yaml").read_text().count(server.token) == 1
    for secret in (server.token, DB_PASSWORD, "SQLite format", "slurm_job_id"):
        assert secret not in out, (secret, out)


def test_cordon_drains_in_slurm_and_uncordon_resumes(api: httpx.Client, slurm_cluster: SlurmCluster) -> None:
    node = slurm_cluster.node_names[1]
    r = api.post(f"/api/v1/nodes/{node}/cordon")
    assert r.status_code == 200, r.text
    wait_for(lambda: sinfo_state(slurm_cluster, node) == "drained", 10, what=f"{node} drained in sinfo")
    reason = slurm(slurm_cluster, "sinfo", "-h", "-n", node, "-N", "-o", "%E").strip()
    assert reason.startswith("corral cordon"), reason
    wait_for(lambda: nodes_by_name(api)[node]["state"] == "cordoned", 10, what=f"{node} cordoned in Corral")
    # Nothing new lands on a cordoned node: a job that would fit there goes elsewhere.
    job_id = submit(api, gang_spec("avoid", "true", instances=1, gpus=4))
    done = wait_state(api, job_id, TERMINAL)
    assert done["state"] == "succeeded" and node not in done["attempts"][0]["nodes"], done

    r = api.post(f"/api/v1/nodes/{node}/uncordon")
    assert r.status_code == 200, r.text
    wait_for(lambda: sinfo_state(slurm_cluster, node) == "idle", 10, what=f"{node} idle again in sinfo")
    wait_for(lambda: nodes_by_name(api)[node]["state"] == "ready", 10, what=f"{node} ready in Corral")


def test_drain_in_slurm_shows_as_draining_in_corral(api: httpx.Client, slurm_cluster: SlurmCluster) -> None:
    node = slurm_cluster.node_names[2]
    slurm(slurm_cluster, "scontrol", "update", f"nodename={node}", "state=drain", "reason=disk check")
    wait_for(lambda: nodes_by_name(api)[node]["state"] == "draining", 10, what=f"{node} draining in Corral")
    slurm(slurm_cluster, "scontrol", "update", f"nodename={node}", "state=resume")
    wait_for(lambda: nodes_by_name(api)[node]["state"] == "ready", 10, what=f"{node} ready in Corral")


def rank_nodes(attempt: dict[str, Any]) -> list[str]:
    """The node of each rank, in rank order."""
    return [p["node"] for p in sorted(attempt["placement"], key=lambda p: p["rank"])]


def processes_of_slurm_job(slurm_id: str) -> list[int]:
    """PIDs (any namespace) whose environment says they belong to Slurm job `slurm_id`."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("SLURM_JOB_ID") == slurm_id:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            continue
    return found


def watch_crash(
    c: httpx.Client, job_id: int, node: str, timeout_s: float, state_dir: Path
) -> dict[str, float]:
    """Seconds from now until Corral saw: the node leave `ready`, the attempt end, the rerun start
    (its second attempt running or done), the job end. The rerun is released as soon as it exists."""
    t0, seen = time.monotonic(), dict[str, float]()
    while "done" not in seen:
        release(state_dir, job_id, 2, ranks=2)
        assert time.monotonic() - t0 < timeout_s, f"crash of {node} not handled in {timeout_s} s: {seen}"
        j, state = job(c, job_id), nodes_by_name(c)[node]["state"]
        now = time.monotonic() - t0
        if state != "ready":
            seen.setdefault("node_not_ready", now)
        if j["attempts"][0]["state"] != "running":
            seen.setdefault("attempt_ended", now)
        if len(j["attempts"]) > 1 and j["attempts"][1]["state"] not in ("scheduled", "starting"):
            seen.setdefault("rerun_running", now)
        if j["state"] in TERMINAL:
            seen["done"] = now
        time.sleep(0.1)
    return seen


def test_node_crash_reruns_gang_elsewhere_exactly_once(
    api: httpx.Client, state_dir: Path, slurm_cluster: SlurmCluster
) -> None:
    # A job that is not preemptible runs only inside its group's guaranteed quota (never borrowed
    # GPUs). Its node loss is the platform's, not the job's: it is requeued on the platform-loss
    # budget (services/lifecycle.py), and its own `retries` stay unused.
    r = api.put("/api/v1/groups/default/quota", json={"gpu_model": "*", "guaranteed": 4})
    assert r.status_code == 200, r.text
    spec = gang_spec("crash", RUN_THEN_WAIT, instances=2, gpus=2, cpus=3, retries=1)
    job_id = submit(api, {**spec, "preemptible": False})
    running = wait_state(api, job_id, ("running", *TERMINAL))
    assert running["state"] == "running", running
    wait_for(lambda: len(runs_of(state_dir, job_id, 1, ranks=2)) == 2, 15, what="2 runs")
    first_nodes = rank_nodes(running["attempts"][0])
    (first_slurm_id,) = {line.split()[2] for line in runs_of(state_dir, job_id, 1, ranks=2)}
    crashed = first_nodes[0]  # rank 0's node runs the batch script: its peer must be killed by Slurm

    slurm_cluster.crash_node(crashed)  # slurmd, slurmstepd and the job's processes die at once
    seen = watch_crash(api, job_id, crashed, timeout_s=60, state_dir=state_dir)
    # Corral stopped placing on the node before the attempt ended: the rerun cannot land there.
    assert seen.get("node_not_ready", 1e9) <= seen["attempt_ended"], seen
    print(f"\n[slurm e2e] crash of {crashed} (gang on {first_nodes}), seconds after: {seen}")

    done = job(api, job_id)
    first, second = done["attempts"]
    assert first["state"] == "lost" and first["reason"] == "node_lost", first
    assert done["state"] == "succeeded" and second["state"] == "succeeded", done
    second_nodes = rank_nodes(second)
    assert len(set(second_nodes)) == 2 and crashed not in second_nodes, second
    assert done["attempt_count"] == 2 and done["platform_losses"] == 1 and done["own_failures"] == 0, done
    assert any("requeued (platform loss 1 of" in e["message"] for e in done["events"]), done["events"]
    # Slurm ended the first job as NODE_FAIL and did not requeue it (a requeue = a second run) ...
    first_job = scontrol_job(slurm_cluster, first_slurm_id)
    assert first_job["JobState"] == "NODE_FAIL" and first_job["Restarts"] == "0", first_job
    # ... and the first attempt's instance on the surviving node was stopped too.
    wait_for(lambda: not processes_of_slurm_job(first_slurm_id), 15, what="first attempt's processes gone")
    # Exactly one run per instance per attempt, still so once the crashed node is back.
    slurm_cluster.start_node(crashed, wait=True)
    time.sleep(2)
    lines = runs_of(state_dir, job_id, 1, ranks=2) + runs_of(state_dir, job_id, 2, ranks=2)
    runs = sorted(tuple(line.split()[:2]) for line in lines)
    expected = [(n, str(rank)) for rank, n in enumerate(first_nodes)]
    expected += [(n, str(rank)) for rank, n in enumerate(second_nodes)]
    assert runs == sorted(expected), runs
    assert "released on" in logs(api, job_id, 0, attempt=2) and "released on" in logs(
        api, job_id, 1, attempt=2
    )


def test_server_restart_readopts_running_slurm_job(
    api: httpx.Client, server: CorralServer, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    job_id = submit(api, gang_spec("adopt", RUN_THEN_WAIT, instances=1, gpus=1))
    wait_state(api, job_id, ("running", *TERMINAL))
    wait_for(lambda: runs_of(state_dir, job_id, 1), 15, what="the run's marker line")
    server.kill()  # SIGKILL: no clean shutdown; the Slurm job goes on without the server
    server.start()
    assert job(api, job_id)["state"] == "running"
    release(state_dir, job_id, 1)
    done = wait_state(api, job_id, TERMINAL)
    assert done["state"] == "succeeded" and len(done["attempts"]) == 1, done
    assert "released" in logs(api, job_id, 0)
    (run,) = runs_of(state_dir, job_id, 1)  # one run: adopted, not launched again
    (slurm_job,) = slurm_jobs_of(slurm_cluster, state_dir, job_id, 1)
    assert slurm_job["state"] == "COMPLETED" and run.split()[2] == slurm_job["id"], (run, slurm_job)


def test_slurm_outage_keeps_jobs_and_recovers(
    api: httpx.Client, slurm_cluster: SlurmCluster, state_dir: Path
) -> None:
    running_id = submit(api, gang_spec("through", RUN_THEN_WAIT, instances=1, gpus=1))
    wait_state(api, running_id, ("running", *TERMINAL))
    t0 = time.monotonic()
    slurm_cluster.stop_controller()
    try:
        wait_for(
            lambda: {n["state"] for n in nodes_by_name(api).values()} == {"unknown"},
            30,
            what="every node unknown while slurmctld is down",
        )
        t_unknown = time.monotonic() - t0
        queued_id = submit(api, gang_spec("waits", "echo ran", instances=1, gpus=1))
        time.sleep(2)
        assert job(api, queued_id)["state"] == "queued"  # nowhere to place it: nodes are unknown
        assert job(api, running_id)["state"] == "running"  # an outage fails nothing
    finally:
        slurm_cluster.start_controller(fresh=False)  # recovers its jobs from the state dir
    t1 = time.monotonic()
    wait_for(lambda: all_ready(api, slurm_cluster), 30, what="nodes ready once slurmctld is back")
    t_ready = time.monotonic() - t1
    release(state_dir, running_id, 1)
    assert wait_state(api, queued_id, TERMINAL)["state"] == "succeeded"
    done = wait_state(api, running_id, TERMINAL)
    assert done["state"] == "succeeded" and len(done["attempts"]) == 1, done
    assert len(runs_of(state_dir, running_id, 1)) == 1
    print(f"\n[slurm e2e] outage: nodes unknown after {t_unknown:.1f} s; ready {t_ready:.1f} s after restart")
