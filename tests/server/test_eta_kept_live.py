"""The live loop under the `default` profile, whose `eta_reuse_s` knob is on (60 s: the simulator's
targeted estimates may continue a roll kept from an earlier cycle, scheduler/eta_kept.py): the live
loop writes the full diagnoses, which never continue a kept roll, so an estimate it shows is
rolled afresh at every tick, is never before the tick's `now`, and follows a start or an end at
once. Real SQLite database, real loops, a fake engine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from corral.db.models import Job
from corral.db.session import make_engine
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.scheduling import schedule_tick, scheduler_for
from corral.services.policy import active_profile
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, run_dispatch, seed_tenant


def _job(ctx: ServerContext, job_id: int) -> Job:
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def _estimate(ctx: ServerContext, job_id: int, now: float) -> float:
    job = _job(ctx, job_id)
    assert job.state == "queued" and job.diagnosis is not None
    at = job.diagnosis.estimated_start
    assert at is not None and at >= now  # never in the past
    return at


def test_live_estimates_are_rolled_afresh_every_tick_with_the_knob_on(tmp_path: Path) -> None:
    fake = FakeEngine([gpu_node("n1", gpus=4)])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    assert ctx.settings.scheduler_profile == "default" and active_profile(ctx.settings).eta_reuse_s == 60.0
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        blocker = add_job(session, gid, uid, gpus=4, name="blocker")
        job = session.get(Job, blocker)
        assert job is not None
        job.runtime_estimate_s = 3600.0  # no spread: its expected end stays at its start + 3600
        session.commit()
    t0 = time.time()
    schedule_tick(ctx, t0)  # `blocker` takes every GPU (placed at t0: its start, to the loop)
    with ctx.session_factory() as session:
        waiting = add_job(session, gid, uid, gpus=4, name="next")
        behind = add_job(session, gid, uid, gpus=4, name="after")
    schedule_tick(ctx, t0 + 1)
    first = _estimate(ctx, waiting, t0 + 1)
    assert first == pytest.approx(t0 + 3600, abs=1.0)
    before = _estimate(ctx, behind, t0 + 1)
    assert before > first
    # 30 s later, nothing started or ended (within eta_reuse_s of the last roll) and a job joined
    # behind the others (what a targeted read would continue the kept roll for): the estimates
    # are the fresh roll's, the blocker's end, not a kept roll's read 30 s later (t0 + 3630)
    with ctx.session_factory() as session:
        last = add_job(session, gid, uid, gpus=4, name="last")
    schedule_tick(ctx, t0 + 31)
    assert _estimate(ctx, last, t0 + 31) > before
    # (what the loop writes moves only past a slack, so the proof that no roll was continued is
    # the loop's own Scheduler: it never kept one)
    kept = scheduler_for(ctx, active_profile(ctx.settings)).kept_rolls
    assert kept.kept is None and kept.reused == 0
    assert _estimate(ctx, waiting, t0 + 31) == pytest.approx(first, abs=1.0)
    assert _estimate(ctx, behind, t0 + 31) == pytest.approx(before, abs=1.0)
    # the blocker ends: `next` starts at once and `after` is rolled again from `next`'s start
    run_dispatch(ctx)
    fake.run(f"{blocker}.1")
    reconcile_tick(ctx, time.time())
    fake.finish(f"{blocker}.1", 0)
    reconcile_tick(ctx, time.time())
    t1 = t0 + 40
    schedule_tick(ctx, t1)
    assert _job(ctx, waiting).state == "scheduled"
    again = _estimate(ctx, behind, t1)
    assert again < before - 1000  # behind one job's run now, not two
