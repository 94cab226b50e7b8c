"""Holds in the live schedule loop, on a real SQLite database with a fake engine: a held job is
not placed while GPUs are free, counts in no one's queue position, and is placed after its
release (which wakes the schedule loop); and the hold's race with the scheduler's placement,
decided by the two compare-and-sets of services/lifecycle.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from corral.db.models import Job, User
from corral.db.session import make_engine
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.scheduling import schedule_tick
from corral.services import holds, notify
from corral.services.auth import Principal, load_principal
from corral.services.errors import Conflict
from corral.services.lifecycle import hold, schedule_jobs
from corral.services.views import job_view
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant


@pytest.fixture
def ctx(tmp_path: Path) -> ServerContext:
    fake = FakeEngine([gpu_node("n1", gpus=4)])
    context = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    notify.bind(context.session_factory, context)  # as the server binds its API's sessions
    node_tick(context, time.time())
    return context


def principal(session: Session, user_id: int) -> Principal:
    user = session.get(User, user_id)
    assert user is not None
    return load_principal(session, user, via="token")


def state_of(ctx: ServerContext, job_id: int) -> Job:
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        session.expunge(job)
        return job


def test_a_held_job_is_not_placed_on_free_gpus_and_is_placed_once_released(ctx: ServerContext) -> None:
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        job_id = add_job(session, gid, uid, gpus=1, name="held")
        outcome = holds.hold_job(session, principal(session, uid), job_id)
        assert outcome["changed"] is True
    schedule_tick(ctx, time.time())  # 4 GPUs free, one job queued: held, so not placed
    job = state_of(ctx, job_id)
    assert job.state == "queued" and job.held_by == uid and job.diagnosis is None and job.attempt_count == 0
    ctx.memory.asked.clear()
    with ctx.session_factory() as session:
        assert holds.release_job(session, principal(session, uid), job_id)["changed"] is True
    assert "schedule" in ctx.memory.asked  # the release woke the schedule loop, as a submit does
    schedule_tick(ctx, time.time())
    job = state_of(ctx, job_id)
    assert job.state == "scheduled" and job.held_by is None and job.attempt_count == 1


def test_a_held_job_counts_in_no_queue_position_and_keeps_its_place(ctx: ServerContext) -> None:
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        running = add_job(session, gid, uid, gpus=4, name="running")
    schedule_tick(ctx, time.time())  # `running` takes every GPU
    with ctx.session_factory() as session:
        first = add_job(session, gid, uid, gpus=4, name="first")
        holds.hold_job(session, principal(session, uid), first)
        second = add_job(session, gid, uid, gpus=4, name="second")
    now = time.time()
    schedule_tick(ctx, now)
    assert state_of(ctx, running).state == "scheduled"
    behind = state_of(ctx, second).diagnosis
    assert behind is not None and behind.queue_position == 1  # the held job is not ahead of it
    with ctx.session_factory() as session:
        held = session.get(Job, first)
        assert held is not None and held.diagnosis is None
        view = job_view(held)["diagnosis"]
        assert view is not None and view["queue_position"] is None and view["estimated_start"] is None
        assert view["reasons"][0]["message"].startswith("held by u since ")
        holds.release_job(session, principal(session, uid), first)
    schedule_tick(ctx, now + 1)
    released, behind = state_of(ctx, first).diagnosis, state_of(ctx, second).diagnosis
    assert released is not None and released.queue_position == 1  # submitted first: first again
    assert behind is not None and behind.queue_position == 2


def test_a_hold_committed_before_the_placement_wins(ctx: ServerContext) -> None:
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        job_id = add_job(session, gid, uid, gpus=1)
    scheduler = ctx.session_factory()
    stale = scheduler.get(Job, job_id)  # the schedule loop's copy: queued, not held
    assert stale is not None and stale.held_by is None
    scheduler.commit()
    with ctx.session_factory() as session:  # the hold commits in between
        job = session.get(Job, job_id)
        assert job is not None and hold(
            session, job, user_id=uid, as_admin=False, now=time.time(), message="held"
        )
        session.commit()
    assert schedule_jobs(scheduler, [stale], now=time.time(), messages={}) == {}  # lost: nothing written
    scheduler.commit()
    scheduler.close()
    job = state_of(ctx, job_id)
    assert job.state == "queued" and job.held_by == uid and job.attempt_count == 0


def test_a_placement_committed_before_the_hold_wins(ctx: ServerContext) -> None:
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        job_id = add_job(session, gid, uid, gpus=1)
    holder = ctx.session_factory()
    stale = holder.get(Job, job_id)  # the hold's copy: queued
    assert stale is not None and stale.state == "queued"
    holder.commit()
    with ctx.session_factory() as session:  # the scheduler places it in between
        job = session.get(Job, job_id)
        assert job is not None
        assert schedule_jobs(session, [job], now=time.time(), messages={}) == {job_id: 1}
        session.commit()
    assert (
        hold(holder, stale, user_id=uid, as_admin=False, now=time.time(), message="held") is False
    )  # nothing written
    holder.rollback()
    assert stale.state == "scheduled" and stale.held_by is None  # expired by the lost race: re-read
    holder.close()
    with ctx.session_factory() as session, pytest.raises(Conflict) as refused:
        holds.hold_job(session, principal(session, uid), job_id)
    assert (
        str(refused.value) == f"job {job_id} is scheduled: only a queued job can be held; cancel it instead"
    )
    assert state_of(ctx, job_id).held_by is None
