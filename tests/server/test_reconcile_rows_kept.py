"""The reconcile loop under a runner reads its live rows only when asked or when the last read is
older than ROWS_KEPT_S (docs/slurm.md, 2026-11-29 round): before, one SELECT every tick (25 a
second on Slurm) although the rows change only when something wakes the loop. The engine is still
polled at every tick, so a job's end is seen as before. Real SQLite, the fake engine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select, update

from corral.db.models import Job
from corral.db.session import make_engine
from corral.server import reconcile
from corral.server.context import ServerContext
from corral.server.dispatch import dispatch_tick
from corral.server.nodes import node_tick
from corral.server.reconcile import ROWS_KEPT_S, reconcile_tick
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant
from tests.server.test_record_batches import launched
from tests.server.test_tick_statements import statements


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now


def running_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> tuple[ServerContext, FakeEngine, list[int]]:
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    fake = FakeEngine([gpu_node("n0", gpus=n)])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=n)
        jobs = [add_job(session, gid, uid) for _ in range(n)]
    ctx.memory.lease_until["dispatch"] = float("inf")
    launched(ctx, n)
    dispatch_tick(ctx, time.time())
    for attempt_id in list(fake.launched):
        fake.run(attempt_id)
    reconcile_tick(ctx, time.time())  # records them running
    return ctx, fake, jobs


def test_ticks_between_wakes_read_no_rows_and_still_see_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, fake, jobs = running_jobs(tmp_path, monkeypatch, 2)
    clock = Clock()
    monkeypatch.setattr(reconcile, "time", type("T", (), {"monotonic": clock.monotonic, "time": time.time}))
    ctx.memory.lease_until["reconcile"] = float("inf")  # a runner's loop
    reconcile_tick(ctx, time.time())  # reads (its own writes last tick)
    with statements(ctx) as seen:
        for _ in range(5):
            reconcile_tick(ctx, time.time())
    assert seen == []  # before: one SELECT per tick
    fake.finish(f"{jobs[0]}.1", 0)  # an end: the engine is polled at every tick
    with statements(ctx) as seen:
        reconcile_tick(ctx, time.time())
    assert seen  # recorded
    with ctx.session_factory() as session:
        assert session.get(Job, jobs[0]).state == "succeeded"
    with statements(ctx) as seen:
        reconcile_tick(ctx, time.time())  # after its own writes: reads again
    assert len(seen) == 1


def test_a_cancel_is_read_when_it_wakes_the_loop_or_once_the_rows_are_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, fake, jobs = running_jobs(tmp_path, monkeypatch, 2)
    clock = Clock()
    monkeypatch.setattr(reconcile, "time", type("T", (), {"monotonic": clock.monotonic, "time": time.time}))
    ctx.memory.lease_until["reconcile"] = float("inf")
    reconcile_tick(ctx, time.time())
    with ctx.session_factory() as session:  # as another server would: nothing wakes this one
        session.execute(update(Job).where(Job.id == jobs[0]).values(cancel_requested=True))
        session.commit()
    reconcile_tick(ctx, time.time())
    assert fake.stopped == []  # the kept rows: not seen yet
    clock.now += ROWS_KEPT_S
    reconcile_tick(ctx, time.time())
    assert [a for a, _ in fake.stopped] == [f"{jobs[0]}.1"]
    with ctx.session_factory() as session:  # as the API's cancel does: it wakes the loop
        session.execute(update(Job).where(Job.id == jobs[1]).values(cancel_requested=True))
        session.commit()
    ctx.wake("reconcile")
    reconcile_tick(ctx, time.time())
    assert sorted(a for a, _ in fake.stopped) == sorted([f"{jobs[0]}.1", f"{jobs[1]}.1"])
    with ctx.session_factory() as session:
        assert session.scalars(select(Job.state).where(Job.id.in_(jobs))).all() == ["running", "running"]


def test_without_a_runner_every_tick_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test or tool driving ticks itself gets no kept rows (nothing would wake it)."""
    ctx, _fake, _jobs = running_jobs(tmp_path, monkeypatch, 1)
    reconcile_tick(ctx, time.time())
    with statements(ctx) as seen:
        reconcile_tick(ctx, time.time())
    assert len(seen) == 1
