"""A tiny in-memory engine for unit tests of the control loops only (end-to-end tests use the
real local engine). It records what the loops asked for and answers what the test says."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from corral.config import Settings
from corral.db.base import Base
from corral.db.models import Group, GroupQuota, Job, Membership, User
from corral.engine.base import (
    DEFAULT_LAUNCH_WORKERS,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_QUEUE_AHEAD_DEPTH,
    AttemptLaunch,
    AttemptPhase,
    AttemptStatus,
    ExecCommand,
    ExecRefused,
    LogChunk,
    NodeReport,
)
from corral.scheduler.types import GPU, NodeState
from corral.server.context import ServerContext
from corral.services.lifecycle import JobState


class FakeEngine:
    name = "local"
    poll_interval_s = DEFAULT_POLL_INTERVAL_S
    launch_workers = DEFAULT_LAUNCH_WORKERS
    queue_ahead_depth = DEFAULT_QUEUE_AHEAD_DEPTH

    def __init__(self, nodes: Sequence[NodeReport] = ()) -> None:
        self.reports = list(nodes)
        self.launched: dict[str, AttemptLaunch] = {}
        self.launch_calls = 0
        self.statuses: dict[str, AttemptStatus] = {}
        self.stopped: list[tuple[str, float]] = []
        self.adopted: dict[str, str] = {}
        self.node_states: dict[str, NodeState] = {}
        self.fail_launch: str | None = None
        self.removed: list[str] = []

    def nodes(self) -> Sequence[NodeReport]:
        return list(self.reports)

    def launch(self, attempt: AttemptLaunch) -> str:
        self.launch_calls += 1
        if self.fail_launch:
            raise RuntimeError(self.fail_launch)
        self.launched.setdefault(attempt.attempt_id, attempt)
        self.statuses.setdefault(attempt.attempt_id, AttemptStatus(attempt.attempt_id, AttemptPhase.PENDING))
        return f"ref-{attempt.attempt_id}"

    def poll(self, attempt_ids: Iterable[str]) -> Mapping[str, AttemptStatus]:
        return {a: self.statuses.get(a, AttemptStatus(a, AttemptPhase.LOST)) for a in attempt_ids}

    def stop(self, attempt_id: str, grace_s: float) -> None:
        self.stopped.append((attempt_id, grace_s))

    def logs(self, attempt_id: str, instance: int = 0, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        return LogChunk(b"", offset, True)

    def adopt(self, refs: Mapping[str, str]) -> None:
        self.adopted.update(refs)

    def set_node_state(self, node: str, state: NodeState, reason: str = "") -> None:
        self.node_states[node] = state

    def remove_attempt(self, attempt_id: str) -> None:
        self.removed.append(attempt_id)

    def exec_command(self, attempt_id: str, rank: int, argv: Sequence[str]) -> ExecCommand:
        raise ExecRefused(f"the fake engine runs no processes (attempt {attempt_id})")

    def close(self) -> None:
        pass

    # test helpers
    def finish(self, attempt_id: str, exit_code: int) -> None:
        now = time.time()
        phase = AttemptPhase.SUCCEEDED if exit_code == 0 else AttemptPhase.FAILED
        self.statuses[attempt_id] = AttemptStatus(
            attempt_id, phase, exit_code=exit_code, started_at=now - 1, finished_at=now
        )

    def run(self, attempt_id: str, started_at: float | None = None) -> None:
        """The attempt runs, started at `started_at` (None: a second ago)."""
        at = time.time() - 1 if started_at is None else started_at
        self.statuses[attempt_id] = AttemptStatus(attempt_id, AttemptPhase.RUNNING, started_at=at)


def gpu_node(name: str = "n1", gpus: int = 4, model: str = "VGPU", address: str = "10.0.0.1") -> NodeReport:
    return NodeReport(
        name=name,
        cpus=16,
        memory_mib=65536,
        address=address,
        gpus=tuple(GPU(index=i, uuid=f"GPU-{name}-{i}", model=model) for i in range(gpus)),
    )


def make_context(db: Engine, engine: Any, tmp_home: str) -> ServerContext:
    Base.metadata.create_all(db)
    factory = sessionmaker(bind=db, expire_on_commit=False)
    settings = Settings(home=tmp_home, virtual_gpus=4)
    return ServerContext(settings=settings, session_factory=factory, engine=engine, owner_id="test:1:aa")


def seed_tenant(session: Session, group: str = "g", user: str = "u", guaranteed: int = 4) -> tuple[int, int]:
    now = time.time()
    grp = Group(name=group, created_at=now, weight=1.0, borrowing=True)
    grp.quotas = [GroupQuota(gpu_model="*", guaranteed=guaranteed, max=None)]
    session.add(grp)
    session.flush()
    usr = User(name=user, is_admin=False, default_group_id=grp.id, created_at=now, active=True)
    session.add(usr)
    session.flush()
    session.add(Membership(user_id=usr.id, group_id=grp.id, role="member"))
    session.commit()
    return grp.id, usr.id


def add_job(
    session: Session,
    group_id: int,
    user_id: int,
    *,
    gpus: int = 1,
    instances: int = 1,
    retries: int = 0,
    preemptible: bool = True,
    command: str = "true",
    name: str = "j",
) -> int:
    now = time.time()
    spec = {
        "version": 1,
        "name": name,
        "retries": retries,
        "preemptible": preemptible,
        "tasks": {
            "worker": {
                "instances": instances,
                "command": command,
                "resources": {"gpus": gpus, "cpus": 1.0, "memory": 1024},
            }
        },
        "env": {"EPOCHS": "3"},
    }
    job = Job(
        name=name,
        user_id=user_id,
        group_id=group_id,
        state=JobState.QUEUED.value,
        priority=1,
        preemptible=preemptible,
        spec=spec,
        max_retries=retries,
        attempt_count=0,
        gpus=gpus * instances,  # as a real submit sets it (services/jobs.py): the ETA size class reads it
        submitted_at=now,
        updated_at=now,
        cancel_requested=False,
        reason="",
        attained_gpu_seconds=0.0,
    )
    session.add(job)
    session.commit()
    return job.id


def run_dispatch(ctx: ServerContext, timeout_s: float = 5.0) -> None:
    """One dispatch tick, wait for its launches on the pool, and the tick that records them."""
    from corral.server.dispatch import dispatch_tick, launch_queue

    dispatch_tick(ctx, time.time())
    queue = launch_queue(ctx)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with queue.lock:
            if queue.in_flight <= {r[0] for r in queue.done}:
                break
        time.sleep(0.005)
    dispatch_tick(ctx, time.time())
