"""The schedule loop hands the jobs it just placed straight to the launch pool (dispatch.
launch_placed), without waiting for the dispatch loop's next tick; the pool is as wide as the
engine asks (`launch_workers`). Real SQLite, the fake engine records what it was asked to launch."""

from __future__ import annotations

import time
from pathlib import Path

from corral.db.models import Job
from corral.db.session import make_engine
from corral.engine.base import DEFAULT_LAUNCH_WORKERS
from corral.engine.local.engine import LocalEngine
from corral.server.dispatch import launch_queue, launch_workers
from corral.server.nodes import node_tick
from corral.server.scheduling import schedule_tick
from corral.services.lifecycle import JobState
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant


def test_a_placed_job_reaches_the_engine_within_the_schedule_tick(tmp_path: Path) -> None:
    fake = FakeEngine([gpu_node("n1")])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
    schedule_tick(ctx, time.time())  # no dispatch tick at all
    queue = launch_queue(ctx)
    deadline = time.monotonic() + 5.0
    while not fake.launched and time.monotonic() < deadline:
        time.sleep(0.005)
    assert [a.job_id for a in fake.launched.values()] == [str(job_id)]
    with queue.lock:  # in flight until the dispatch loop records it STARTING
        assert job_id in queue.in_flight
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.SCHEDULED.value
        assert job.lease_owner == ctx.owner_id  # claimed like any dispatch, by its row lease


def test_the_engine_sets_how_many_launches_run_at_once() -> None:
    class Wide(FakeEngine):
        launch_workers = 12

    class Zero(FakeEngine):
        launch_workers = 0  # a misconfigured engine: one launch at a time, never a pool of none

    assert launch_workers(Wide()) == 12
    assert launch_workers(Zero()) == 1
    assert LocalEngine.launch_workers == DEFAULT_LAUNCH_WORKERS  # the real local engine's width
