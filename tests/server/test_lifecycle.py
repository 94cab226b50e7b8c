"""The lifecycle rules on the real loops (SQLite, FakeEngine): compare-and-set state writes,
the exit-0-while-preempted rule, and a cancel racing the scheduling cycle."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from corral.db.models import Attempt, GpuClaim, Job, User
from corral.db.session import make_engine
from corral.scheduler import types as st
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.scheduling import apply_assignments, apply_preemption
from corral.services.auth import Principal
from corral.services.jobs import cancel_job
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, run_dispatch, seed_tenant


@pytest.fixture
def env(tmp_path: Path) -> tuple[ServerContext, FakeEngine]:
    fake = FakeEngine([gpu_node("n1", address="10.0.0.1"), gpu_node("n2", address="10.0.0.2")])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    return ctx, fake


def assignment(job_id: int, node: str = "n1", gpus: tuple[int, ...] = (0,)) -> st.Assignment:
    allocation = st.Allocation(str(job_id), (st.InstancePlacement("worker", 0, node, gpus, 1.0, 1024),))
    return st.Assignment(str(job_id), allocation)


def job_state(ctx: ServerContext, job_id: int) -> str:
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.state


def attempts_of(ctx: ServerContext, job_id: int) -> list[tuple[int, str]]:
    with ctx.session_factory() as session:
        rows = session.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number))
        return [(a.number, a.state) for a in rows]


def running_job(ctx: ServerContext, fake: FakeEngine, **job: object) -> int:
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, **job)  # type: ignore[arg-type]
    with ctx.session_factory() as session:
        assert apply_assignments(session, [assignment(job_id)], time.time()) == 1
    run_dispatch(ctx)
    fake.run(f"{job_id}.1")
    reconcile_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "running"
    return job_id


def test_preemption_of_a_job_whose_completion_was_committed_meanwhile_changes_nothing(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as scheduler_session:
        stale = scheduler_session.get(Job, job_id)  # the schedule loop read the job: RUNNING
        assert stale is not None and stale.state == "running"
        fake.finish(f"{job_id}.1", 0)
        reconcile_tick(ctx, time.time())  # another session commits its completion
        assert job_state(ctx, job_id) == "succeeded"
        preemption = st.Preemption(str(job_id), 5.0, "reclaimed by group x")
        assert not apply_preemption(scheduler_session, preemption, time.time())
    assert job_state(ctx, job_id) == "succeeded"
    assert attempts_of(ctx, job_id) == [(1, "succeeded")]


def test_attempt_that_exits_0_before_the_preemption_stop_succeeds_and_is_not_run_again(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        assert apply_preemption(session, st.Preemption(str(job_id), 5.0, "reclaimed"), time.time())
    fake.finish(f"{job_id}.1", 0)  # its work was done before the reconcile loop sent the stop
    time.sleep(0.01)
    reconcile_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "succeeded"
    assert attempts_of(ctx, job_id) == [(1, "succeeded")]
    with ctx.session_factory() as session:
        assert session.scalars(select(GpuClaim)).all() == []
    run_dispatch(ctx)
    assert fake.launch_calls == 1  # never launched a second time


def test_cancel_committed_while_the_schedule_cycle_applies_its_plan_stays_cancelled(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    ctx, _fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
        user = session.get(User, uid)
        assert user is not None
        owner = Principal(user_id=uid, name=user.name, is_admin=False, default_group_id=gid)
    with ctx.session_factory() as scheduler_session:
        # The cycle has read the queued job (apply_assignments reads every job of the plan first);
        # the session keeps that copy (held here, as the cycle holds it) while the API cancels.
        read_by_cycle = scheduler_session.get(Job, job_id)
        assert read_by_cycle is not None and read_by_cycle.state == "queued"
        with ctx.session_factory() as api_session:
            assert cancel_job(api_session, owner, job_id).state == "cancelled"
        applied = apply_assignments(scheduler_session, [assignment(job_id)], time.time())
    assert applied == 0
    assert job_state(ctx, job_id) == "cancelled"
    assert attempts_of(ctx, job_id) == []
    with ctx.session_factory() as session:
        assert session.scalars(select(GpuClaim)).all() == []
