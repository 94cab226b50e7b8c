"""Builders and waits shared by the Slurm tests and the benchmark."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral.engine.base import AttemptLaunch, AttemptPhase, AttemptStatus, Engine, InstanceLaunch, MountSpec
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm.users import UserMap
from corral.scheduler.types import GPU
from tests.slurm.harness import SlurmCluster


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
