"""Builders and waits shared by the Slurm tests and the benchmark: for the engine (an engine on the
test cluster, launches, waits) and for a Corral server on it (its settings, REST calls, Slurm's view
of its jobs, the marker files its test jobs write)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from corral.engine.base import AttemptLaunch, AttemptPhase, AttemptStatus, Engine, InstanceLaunch, MountSpec
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm.users import UserMap
from corral.scheduler.types import GPU
from tests.server_fixture import logs as logs  # the REST log read, shared with tests/server
from tests.slurm.harness import TEST_GIDS, SlurmCluster


def slurm_engine(cluster: SlurmCluster, state_dir: Path | None = None, **kwargs: Any) -> SlurmEngine:
    """An engine on `cluster` as a deployment would set it up: the test accounts' user map, the
    fake GPUs' device files, a state dir the job accounts can reach."""
    kwargs.setdefault("timeout_s", 15)
    kwargs.setdefault("user_map", UserMap(str(cluster.user_map)))
    return SlurmEngine(
        state_dir=state_dir or cluster.new_state_dir(),
        slurm_conf=str(cluster.conf),
        gpu_device=cluster.gpu_device,
        **kwargs,
    )


def server_env(cluster: SlurmCluster, state_dir: Path, storage_root: Path | None = None) -> dict[str, str]:
    """A Corral server's settings on `cluster`, as a deployment would set it up (the same user map,
    GPU device files and command timeout as `slurm_engine`); a test adds its own to them.
    `storage_root`: default a fresh dir the job accounts can reach."""
    storage = storage_root or cluster.new_state_dir() / "storage"
    return {
        "CORRAL_ENGINE": "slurm",
        "CORRAL_SLURM_CONF": str(cluster.conf),
        "CORRAL_SLURM_TIMEOUT_S": "15",
        "CORRAL_SLURM_STATE_DIR": str(state_dir),
        "CORRAL_STORAGE_ROOT": str(storage),
        "CORRAL_SLURM_USER_MAP": str(cluster.user_map),
        "CORRAL_SLURM_GPU_DEVICE": cluster.gpu_device,
        # groups' gids that Unix groups of the test accounts have (harness.TEST_GIDS)
        "CORRAL_GID_RANGE": f"{TEST_GIDS[0]}-{TEST_GIDS[-1]}",
    }


def instance(
    node: str,
    command: str,
    rank: int = 0,
    gpus: Sequence[int] = (),
    env: dict[str, str] | None = None,
    role: str = "main",
    cpus: float = 1.0,
    memory_mib: int = 256,
) -> InstanceLaunch:
    return InstanceLaunch(
        role=role,
        index=rank,
        rank=rank,
        node=node,
        gpus=tuple(GPU(index=i, uuid=f"SLURM-{node}-gpu{i}", model="vgpu") for i in gpus),
        cpus=cpus,
        memory_mib=memory_mib,
        command=command,
        env=env or {},
    )


def attempt(
    attempt_id: str,
    *instances: InstanceLaunch,
    max_runtime_s: float | None = None,
    user: str = "alice",
    rw_mounts: Sequence[Path] = (),
    mounts: Sequence[MountSpec] = (),
) -> AttemptLaunch:
    """rw_mounts: host dirs the job may write, at the same path inside its sandbox."""
    job_id, _, number = attempt_id.partition(".")
    return AttemptLaunch(
        attempt_id=attempt_id,
        job_id=job_id,
        attempt=int(number) if number.isdigit() else 1,
        user=user,
        group="vision",
        instances=tuple(instances),
        max_runtime_s=max_runtime_s,
        mounts=(*mounts, *(MountSpec(str(p), str(p), read_only=False) for p in rw_mounts)),
    )


def wait_for(
    engine: Engine, attempt_id: str, phases: set[AttemptPhase], timeout_s: float = 20.0, every_s: float = 0.1
) -> AttemptStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = engine.poll([attempt_id])[attempt_id]
        if status.phase in phases:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{attempt_id} still {status} after {timeout_s}s, wanted {phases}")
        time.sleep(every_s)


FINISHED = {AttemptPhase.SUCCEEDED, AttemptPhase.FAILED, AttemptPhase.LOST}


class HeldClock:
    """The Slurm engine module's `time`, with a monotonic clock that moves only when the test
    moves it: how long squeue or sbatch takes on a loaded machine cannot age the engine's "every
    job pending" memory past PENDING_RECHECK_S in the middle of a test."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def monotonic(self) -> float:
        return self.now


# ---- a Corral server on the cluster: its jobs through the REST API, Slurm's view of them ----------
TERMINAL = ("succeeded", "failed", "cancelled")
LIVE = ("queued", "scheduled", "starting", "running", "preempted")


def live_jobs(c: httpx.Client) -> list[int]:
    items = c.get("/api/v1/jobs", params={"limit": 500}).json()["items"]
    return [int(i["id"]) for i in items if i["state"] in LIVE]


def gang_spec(
    name: str, command: str, *, instances: int, gpus: int, cpus: float = 1, **extra: Any
) -> dict[str, Any]:
    resources = {"gpus": gpus, "cpus": cpus, "memory": "256MiB"}
    return {
        "name": name,
        "tasks": {"main": {"instances": instances, "command": command, "resources": resources}},
        **extra,
    }


def slurm(cluster: SlurmCluster, *argv: str) -> str:
    r = subprocess.run(list(argv), env=cluster.env, capture_output=True, text=True, timeout=15)
    assert r.returncode == 0, f"{argv}: {r.stderr}"
    return r.stdout


def slurm_jobs_of(cluster: SlurmCluster, state_dir: Path, job_id: int, attempt: int) -> list[dict[str, str]]:
    """The Slurm jobs submitted for one Corral attempt (by job name, and by a working directory
    under this server's state dir: the session's cluster also runs the engine tests' jobs)."""
    out = slurm(
        cluster, "squeue", "-h", "--states=all", f"--name=corral-{job_id}.{attempt}", "-o", "%i|%T|%N|%Z"
    )
    jobs = []
    for line in out.splitlines():
        slurm_id, state, nodelist, workdir = line.split("|", 3)
        if workdir.startswith(str(state_dir)):
            hosts = slurm(cluster, "scontrol", "show", "hostnames", nodelist).split() if nodelist else []
            jobs.append({"id": slurm_id, "state": state, "nodes": ",".join(hosts)})
    return jobs


def scontrol_job(cluster: SlurmCluster, slurm_id: str) -> dict[str, str]:
    out = slurm(cluster, "scontrol", "show", "job", "-o", slurm_id)
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def work_file(state_dir: Path, job_id: int, attempt: int, rank: int, name: str) -> Path:
    """A file in an instance's private work dir (/job inside its sandbox), seen from the host."""
    return state_dir / "attempts" / f"{job_id}.{attempt}" / "job" / "work" / str(rank) / name


# Each instance appends one line (node, rank, Slurm job) to /job/runs.txt (its own work dir, so a
# run that happened twice shows as a second line), then waits until the test puts /job/release.
RUN_THEN_WAIT = (
    'echo "$(hostname) $RANK $SLURM_JOB_ID" >> /job/runs.txt; '
    "while [ ! -e /job/release ]; do sleep 0.1; done; echo released on $(hostname)"
)


def release(state_dir: Path, job_id: int, attempt: int, ranks: int = 1) -> None:
    for rank in range(ranks):
        path = work_file(state_dir, job_id, attempt, rank, "release")
        if path.parent.is_dir():
            path.touch()


def runs_of(state_dir: Path, job_id: int, attempt: int, ranks: int = 1) -> list[str]:
    lines = []
    for rank in range(ranks):
        path = work_file(state_dir, job_id, attempt, rank, "runs.txt")
        lines += path.read_text().splitlines() if path.exists() else []
    return lines
