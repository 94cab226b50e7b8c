"""Builders and waits shared by the Slurm tests and the benchmark."""

from __future__ import annotations

import time
from collections.abc import Sequence

from corral.engine.base import AttemptLaunch, AttemptPhase, AttemptStatus, Engine, InstanceLaunch
from corral.scheduler.types import GPU


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


def attempt(attempt_id: str, *instances: InstanceLaunch, max_runtime_s: float | None = None) -> AttemptLaunch:
    job_id, _, number = attempt_id.partition(".")
    return AttemptLaunch(
        attempt_id=attempt_id,
        job_id=job_id,
        attempt=int(number) if number.isdigit() else 1,
        user="alice",
        group="vision",
        instances=tuple(instances),
        max_runtime_s=max_runtime_s,
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
