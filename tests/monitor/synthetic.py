"""Synthetic cluster state written straight into the database, for the /metrics benchmark and
monitoring tests: nodes with GPUs and readings, groups with quotas, users, jobs in every state,
running jobs with attempts and GPU claims. Bulk Core inserts, so 10,000 jobs take about a second.
Test code (used by bench/ too): not part of the shipped `corral` package."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from corral.db.models import Attempt, GpuClaim, Group, GroupQuota, Job, Node, User
from corral.db.models import Gpu as GpuRow
from corral.domain import InstancePlacement
from corral.monitor.models import GpuReading
from corral.spec import JobSpecV1

FINISHED = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class ClusterShape:
    nodes: int = 4
    gpus_per_node: int = 8
    jobs: int = 20
    groups: int = 3
    users: int = 6
    running_share: float = 0.1  # of jobs; each running job holds `gpus_per_job` GPUs while they last
    queued_share: float = 0.25
    gpus_per_job: int = 4
    model: str = "A100"


@dataclass(frozen=True)
class _Ids:
    """Highest ids already in the tables, so seeding works next to existing rows (the admin)."""

    group: int
    user: int
    job: int
    attempt: int


def _max_id(session: Session, column: Any) -> int:
    return int(session.scalar(select(func.max(column))) or 0)


def seed_cluster(session: Session, shape: ClusterShape, now: float, seed: int = 1) -> dict[str, int]:
    """Insert the state; returns counts (nodes, gpus, jobs, running, queued, claimed)."""
    rng = random.Random(seed)
    base = _Ids(
        group=_max_id(session, Group.id), user=_max_id(session, User.id), job=_max_id(session, Job.id),
        attempt=_max_id(session, Attempt.id),
    )  # fmt: skip
    session.execute(
        insert(Group),
        [
            {
                "id": base.group + g + 1,
                "name": f"group{g}",
                "weight": 1.0,
                "borrowing": True,
                "created_at": now,
            }
            for g in range(shape.groups)
        ],
    )
    session.execute(
        insert(GroupQuota),
        [
            {"group_id": base.group + g + 1, "gpu_model": shape.model, "guaranteed": 16, "max": 64}
            for g in range(shape.groups)
        ],
    )
    session.execute(
        insert(User),
        [
            {
                "id": base.user + u + 1,
                "name": f"user{u}",
                "is_admin": False,
                "default_group_id": base.group + u % shape.groups + 1,
                "active": True,
                "created_at": now,
            }
            for u in range(shape.users)
        ],
    )
    session.execute(
        insert(Node),
        [
            {
                "name": f"node{n:04d}",
                "cpus": 64.0,
                "memory_mib": 512 * 1024,
                "state": "ready",
                "admin_state": "none",
                "address": "127.0.0.1",
                "labels": {},
                "engine": "local",
                "last_heartbeat": now - rng.random() * 5,
                "message": "",
            }
            for n in range(shape.nodes)
        ],
    )
    gpus = [(f"node{n:04d}", i) for n in range(shape.nodes) for i in range(shape.gpus_per_node)]
    session.execute(
        insert(GpuRow),
        [
            {
                "node_name": node,
                "index": i,
                "uuid": f"GPU-virt-{node}-{i}",
                "model": shape.model,
                "memory_mib": 81920,
                "topology_group": i // 4,
                "healthy": True,
            }
            for node, i in gpus
        ],
    )
    session.execute(insert(GpuReading), [_reading(node, i, now, rng) for node, i in gpus])
    return _seed_jobs(session, shape, gpus, now, rng, base)


def _reading(node: str, index: int, now: float, rng: random.Random) -> dict[str, object]:
    util = rng.random() * 100
    return {
        "node": node,
        "gpu_index": index,
        "uuid": f"GPU-virt-{node}-{index}",
        "present": True,
        "utilization_percent": util,
        "memory_used_mib": util * 800,
        "memory_total_mib": 81920.0,
        "temperature_c": 35 + util * 0.4,
        "power_w": 60 + util * 3,
        "ecc_volatile_corrected": 0,
        "ecc_volatile_uncorrected": 0,
        "ecc_aggregate_corrected": rng.randrange(3),
        "ecc_aggregate_uncorrected": 0,
        "xid_events_total": 0,
        "last_xid": None,
        "sampled_at": now - rng.random() * 10,
    }


def _seed_jobs(
    session: Session,
    shape: ClusterShape,
    gpus: list[tuple[str, int]],
    now: float,
    rng: random.Random,
    base: _Ids,
) -> dict[str, int]:
    n_running = int(shape.jobs * shape.running_share)
    n_queued = int(shape.jobs * shape.queued_share)
    jobs: list[dict[str, Any]] = []
    attempts: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    free = list(gpus)
    for j in range(shape.jobs):
        job_id = base.job + j + 1
        state = "running" if j < n_running else "queued" if j < n_running + n_queued else FINISHED[j % 3]
        user_n = j % shape.users
        jobs.append(
            {
                "id": job_id,
                "name": f"job{job_id}",
                "user_id": base.user + user_n + 1,
                "group_id": base.group + user_n % shape.groups + 1,
                "state": state,
                "priority": 1,
                "preemptible": True,
                "spec": JobSpecV1.model_validate({"name": f"job{job_id}", "command": "true"}),
                "max_retries": 0,
                "attempt_count": 0 if state == "queued" else 1,
                "submitted_at": now - rng.random() * 7200,
                "updated_at": now,
                "cancel_requested": False,
                "reason": "",
                "attained_gpu_seconds": 0.0,
            }
        )
        if state != "running" or len(free) < shape.gpus_per_job:
            continue
        held = [free.pop() for _ in range(shape.gpus_per_job)]
        placement = (
            InstancePlacement(
                role="main",
                index=0,
                rank=0,
                node=held[0][0],
                gpu_indices=tuple(i for _, i in held),
                gpu_uuids=tuple(f"GPU-virt-{node}-{i}" for node, i in held),
                cpus=8.0,
                memory_mib=65536,
            ),
        )
        attempts.append(
            {
                "id": base.attempt + len(attempts) + 1,
                "job_id": job_id,
                "number": 1,
                "state": "running",
                "placement": placement,
                "borrowed": False,
                "engine": "local",
                "created_at": now - 60,
                "started_at": now - 50,
                "message": "",
            }
        )
        claims += [
            {"node": node, "gpu_index": i, "attempt_pk": base.attempt + len(attempts), "job_id": job_id}
            for node, i in held
        ]
    session.execute(insert(Job), jobs)
    if attempts:
        session.execute(insert(Attempt), attempts)
    if claims:
        session.execute(insert(GpuClaim), claims)
    session.commit()
    return {
        "nodes": shape.nodes,
        "gpus": len(gpus),
        "jobs": shape.jobs,
        "running": n_running,
        "queued": n_queued,
        "claimed": len(claims),
    }
