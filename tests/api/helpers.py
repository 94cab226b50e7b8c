"""Row builders for API tests (nodes, running jobs) written straight to the database, the way the
control loops would write them."""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy.orm import Session

from corral.db.models import Attempt, Gpu, GpuClaim, Job, Node


def add_node(db: Session, name: str = "n1", gpus: int = 2, model: str = "A100", state: str = "ready") -> Node:
    node = Node(
        name=name,
        cpus=16,
        memory_mib=64 * 1024,
        state=state,
        admin_state="none",
        address="127.0.0.1",
        labels={},
        engine="local",
        last_heartbeat=time.time(),
        message="",
    )
    node.gpus = [
        Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=40960, healthy=True) for i in range(gpus)
    ]
    db.add(node)
    db.flush()
    return node


def make_running(db: Session, job_id: int, node: str = "n1", gpu_indices: tuple[int, ...] = (0,)) -> Attempt:
    """Move a queued job to RUNNING with one attempt holding GPUs, as the loops would."""
    job = db.get(Job, job_id)
    assert job is not None
    now = time.time()
    job.state = "running"
    job.attempt_count = 1
    attempt = Attempt(
        job_id=job_id,
        number=1,
        state="running",
        created_at=now,
        started_at=now,
        message="",
        placement=[
            {
                "role": "main",
                "index": 0,
                "rank": 0,
                "node": node,
                "gpu_indices": list(gpu_indices),
                "gpu_uuids": [f"GPU-{node}-{i}" for i in gpu_indices],
                "cpus": 1,
                "memory_mib": 256,
            }
        ],
    )
    db.add(attempt)
    db.flush()
    for idx in gpu_indices:
        db.add(GpuClaim(node=node, gpu_index=idx, attempt_pk=attempt.id, job_id=job_id))
    db.commit()
    return attempt


def job_state(db: Session, job_id: int) -> str:
    return str(db.scalar(sa.select(Job.state).where(Job.id == job_id)))
