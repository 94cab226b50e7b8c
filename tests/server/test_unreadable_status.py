"""An attempt the Slurm engine failed because its status stayed unreadable (engine/slurm/unreadable.py;
its real-Slurm test: tests/slurm/test_slurm_users.py) is recorded as any engine failure is: through
the lifecycle's compare-and-set, classified by the exit-spec as status_unreadable, the job's own
failure (its account made its status files unreadable), retried within the job's `retries:` and
never charged to the platform-loss budget, and its node is left as it was (no node's fault)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from corral.db.diag_models import AttemptDiagnosis, JobAvoid
from corral.db.models import Attempt, Job, Node
from corral.db.session import make_engine
from corral.engine.base import AttemptPhase, AttemptStatus, FailureReason
from corral.scheduler import types as st
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.scheduling import apply_assignment
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, run_dispatch, seed_tenant

UNREADABLE = (
    "its status files were unreadable for 600 s (Slurm job 41 no longer runs): "
    "PermissionError: [Errno 13] Permission denied: 'rank-0.exit'"
)


@pytest.fixture
def env(tmp_path: Path) -> tuple[ServerContext, FakeEngine]:
    fake = FakeEngine([gpu_node("n1")])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    return ctx, fake


def unreadable_end(ctx: ServerContext, fake: FakeEngine, retries: int) -> int:
    """A job with `retries`, running on n1's GPU 0, whose attempt the engine then ends as unreadable."""
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, retries=retries)
    allocation = st.Allocation(str(job_id), (st.InstancePlacement("worker", 0, "n1", (0,), 1.0, 1024),))
    with ctx.session_factory() as session:
        assert apply_assignment(session, st.Assignment(str(job_id), allocation), time.time())
    run_dispatch(ctx)
    aid = f"{job_id}.1"
    fake.run(aid)
    reconcile_tick(ctx, time.time())
    fake.statuses[aid] = AttemptStatus(
        aid,
        AttemptPhase.FAILED,
        reason=FailureReason.STATUS_UNREADABLE,
        message=UNREADABLE,
        finished_at=time.time(),
        engine_ref="41",
    )
    reconcile_tick(ctx, time.time())
    return job_id


@pytest.mark.parametrize(("retries", "state"), [(1, "queued"), (0, "failed")])
def test_an_unreadable_status_fails_the_attempt_as_the_jobs_own_failure(
    env: tuple[ServerContext, FakeEngine], retries: int, state: str
) -> None:
    ctx, fake = env
    job_id = unreadable_end(ctx, fake, retries)
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert (attempt.state, attempt.reason, attempt.message) == ("failed", "status_unreadable", UNREADABLE)
        diagnosis = session.scalars(select(AttemptDiagnosis).where(AttemptDiagnosis.job_id == job_id)).one()
        assert (diagnosis.reason, diagnosis.category) == ("status_unreadable", "user")
        job = session.get(Job, job_id)
        assert job is not None and job.state == state, job.reason
        assert (job.own_failures, job.platform_losses) == (1, 0)  # the job's failure, its retries
        assert "status_unreadable" in (job.reason or "") and "unreadable for 600 s" in (job.reason or "")
        node = session.get(Node, "n1")
        assert node is not None and node.state == "ready"  # no node's fault: not drained
        assert session.scalars(select(JobAvoid)).all() == []  # nor avoided by the retry
    assert fake.node_states["n1"] is st.NodeState.READY
