"""Estimated starts in the live loop, on a real SQLite database with a fake engine: a job held by
its user's cap says so and gets no time (it used to get a time in the past); a job behind running
work whose runtimes have a spread gets a start range; the API view, the logs' waiting status and
the CLI's line all say the same."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from corral.cli.jobs import start_line
from corral.db.models import Group, Job
from corral.db.session import make_engine
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.scheduling import schedule_tick
from corral.services.jobs import waiting_status
from corral.services.views import job_view
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant


@pytest.fixture
def ctx(tmp_path: Path) -> ServerContext:
    fake = FakeEngine([gpu_node("n1", gpus=4)])
    context = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(context, time.time())
    return context


def test_a_job_held_by_the_per_user_cap_says_so_and_shows_no_time(ctx: ServerContext) -> None:
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        group = session.get(Group, gid)
        assert group is not None
        group.user_max_gpus = 2
        session.commit()
        first = add_job(session, gid, uid, gpus=2, name="first")
    schedule_tick(ctx, time.time())  # `first` takes the user's 2 GPUs
    with ctx.session_factory() as session:
        second = add_job(session, gid, uid, gpus=2, name="second")
    schedule_tick(ctx, time.time())  # 2 GPUs are free, but the user's cap is reached
    with ctx.session_factory() as session:
        assert session.get(Job, first).state == "scheduled"  # type: ignore[union-attr]
        job = session.get(Job, second)
        assert job is not None and job.state == "queued" and job.diagnosis is not None
        d = job.diagnosis
        assert d.estimated_start is None and d.start_range is None and d.held
        (reason,) = d.reasons
        assert reason.code == "user_cap"
        assert "waits for the per-user cap: u may hold 2 GPUs in group g and holds 2; this job needs 2" in (
            reason.message
        )
        view = job_view(job)
        assert view["diagnosis"] is not None
        assert view["diagnosis"]["held"] is True and view["diagnosis"]["estimated_start"] is None
        waiting = waiting_status(job)
        assert waiting is not None and waiting["held"]
        assert "no estimated start while it is held back" in waiting["message"]
        assert "estimated start in" not in waiting["message"]
        assert start_line(dict(view["diagnosis"])).startswith("none while it is held back")


def test_a_job_behind_work_with_a_runtime_spread_gets_a_start_range(ctx: ServerContext) -> None:
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        running = add_job(session, gid, uid, gpus=4, name="long")
        job = session.get(Job, running)
        assert job is not None
        job.runtime_estimate_s = 3600.0
        job.runtime_estimate_low_s, job.runtime_estimate_high_s = 1800.0, 7200.0
        session.commit()
    now = time.time()
    schedule_tick(ctx, now)  # `long` takes every GPU
    with ctx.session_factory() as session:
        waiting = add_job(session, gid, uid, gpus=4, name="next")
    schedule_tick(ctx, now + 1)
    with ctx.session_factory() as session:
        job = session.get(Job, waiting)
        assert job is not None and job.diagnosis is not None
        d = job.diagnosis
        assert not d.held and d.queue_position == 1
        assert d.estimated_start is not None and d.start_range is not None
        early, late = d.start_range
        # the running job's 25th-75th percentile of remaining time, from 1 s into its run
        assert early < d.estimated_start < late
        assert now + 1000 < early and late < now + 8000
        view = job_view(job)
        assert view["diagnosis"] is not None
        line = start_line(dict(view["diagnosis"]))
        assert "(in ~" in line and "(likely " in line
