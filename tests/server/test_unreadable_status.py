"""An attempt the Slurm engine failed because how it ended stayed unreadable (engine/slurm/unreadable.py;
its real-Slurm test: tests/slurm/test_slurm_users.py) is recorded as any engine failure is: through
the lifecycle's compare-and-set, classified by the exit-spec as status_unreadable, the platform's
failure (the job dir's reads skip what the job's account can spoil, so what is left is Corral's
own), requeued on the platform-loss budget as a lost node's attempt is and never charged to the
job's `retries:`, and its node is left as it was (no node's fault: not drained, not avoided)."""

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
    "Corral could not read how its instances ended for 600 s (Slurm job 41 no longer runs): "
    "OSError: [Errno 28] No space left on device: 'attempt.json' (the traceback is in the server's log)"
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


@pytest.mark.parametrize(
    ("retries", "budget", "state", "reason"),
    [
        (0, 1, "queued", "requeued (platform loss 1 of 1)"),
        (5, 0, "failed", "failed 1 time, over the limit of 0"),
    ],
)
def test_an_unreadable_status_fails_the_attempt_as_the_platforms_failure(
    env: tuple[ServerContext, FakeEngine], retries: int, budget: int, state: str, reason: str
) -> None:
    ctx, fake = env
    ctx.settings.lost_requeue_budget = budget
    job_id = unreadable_end(ctx, fake, retries)
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert (attempt.state, attempt.reason, attempt.message) == ("failed", "status_unreadable", UNREADABLE)
        diagnosis = session.scalars(select(AttemptDiagnosis).where(AttemptDiagnosis.job_id == job_id)).one()
        assert (diagnosis.reason, diagnosis.category) == ("status_unreadable", "platform")
        assert "Corral could not read how the job's instances ended" in diagnosis.message
        assert "server's log" in diagnosis.fix
        job = session.get(Job, job_id)
        assert job is not None and job.state == state, job.reason
        # the platform's loss: on its budget (retries: 0 still requeued; 5 left do not save it)
        assert (job.own_failures, job.platform_losses) == (0, 1)
        assert reason in (job.reason or "") and "status_unreadable" in (job.reason or ""), job.reason
        assert "Corral could not read how its instances ended for 600 s" in (job.reason or ""), job.reason
        node = session.get(Node, "n1")
        assert node is not None and node.state == "ready"  # no node's fault: not drained
        assert session.scalars(select(JobAvoid)).all() == []  # nor avoided by the retry
    assert fake.node_states["n1"] is st.NodeState.READY
