"""What the reconcile and dispatch loops read per tick (issue 19, eighth pass): the reconcile
tick's reads in one statement (live attempts and cancelled waiting jobs), and a dispatch tick
woken to record launches reads the scheduled jobs at most once per interval, unless a claim was
asked for. Real SQLite (and PostgreSQL where the statement is new) and the real loops over the
fake engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, update

from corral.db.models import Job, JobEvent
from corral.db.session import make_engine
from corral.server.context import BackgroundLoop, ServerContext
from corral.server.dispatch import DISPATCH_INTERVAL_S, dispatch_tick, launch_queue
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.runner import LoopRunner
from corral.server.scheduling import schedule_tick
from corral.services.notify import Topic
from tests.pg import sqlite_or_postgres_url
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant
from tests.server.test_record_batches import launched
from tests.server.test_snapshot_queries import cluster


@contextmanager
def statements(ctx: ServerContext) -> Iterator[list[str]]:
    """Every statement executed while the block runs, blanks collapsed."""
    seen: list[str] = []
    db = ctx.session_factory.kw["bind"]

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(db, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(db, "before_cursor_execute", count)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sqlite_or_postgres_url(request, tmp_path, "db.sqlite")


def test_an_idle_reconcile_tick_runs_one_statement(tmp_path: Path) -> None:
    ctx = cluster(tmp_path, 1, 0)
    reconcile_tick(ctx, time.time())  # the first tick re-adopts (a read of its own, once)
    with statements(ctx) as seen:
        reconcile_tick(ctx, time.time())
    assert len(seen) == 1, seen  # before: the cancelled waiting jobs and the live attempts apart


def test_the_reconcile_tick_cancels_waiting_jobs_and_stops_live_ones_from_its_one_read(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel request set by another server (nothing wakes this one): the queued job is
    CANCELLED by the next tick; a preempted one whose attempt still runs is not (its attempt is
    stopped first); a running one gets its stop. On PostgreSQL too (the union's NULL columns)."""
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    fake = FakeEngine([gpu_node("n0", gpus=2)])
    ctx = make_context(make_engine(db_url), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=2)
        running, preempted = add_job(session, gid, uid), add_job(session, gid, uid)
    ctx.memory.lease_until["dispatch"] = float("inf")
    launched(ctx, 2)
    dispatch_tick(ctx, time.time())
    for attempt_id in list(fake.launched):
        fake.run(attempt_id)
    reconcile_tick(ctx, time.time())
    with ctx.session_factory() as session:
        queued = add_job(session, gid, uid)  # no GPU left: stays queued
        session.execute(update(Job).where(Job.id == preempted).values(state="preempted"))
        cancelled = [running, preempted, queued]
        session.execute(update(Job).where(Job.id.in_(cancelled)).values(cancel_requested=True))
        session.commit()
    with statements(ctx) as seen:
        reconcile_tick(ctx, time.time())
    reads = [s for s in seen if s.upper().startswith("SELECT")]
    assert "UNION ALL" in reads[0].upper()
    with ctx.session_factory() as session:
        states = {j.id: j.state for j in session.scalars(select(Job))}
        messages = [e.message for e in session.scalars(select(JobEvent).where(JobEvent.job_id == queued))]
    assert states == {running: "running", preempted: "preempted", queued: "cancelled"}
    assert "cancelled by request" in messages
    assert sorted(a for a, _ in fake.stopped) == sorted([f"{running}.1", f"{preempted}.1"])


def scheduled_behind_a_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[ServerContext, int]:
    """Two launches done and waiting to be recorded (their claim read just now), and a third job
    placed since by a schedule loop that did not launch it (another server's, as far as this
    dispatch loop knows): (context, the third job's id)."""
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    ctx = cluster(tmp_path, 2, 2)
    ctx.memory.lease_until["dispatch"] = float("inf")
    launched(ctx, 2)
    with ctx.session_factory() as session:
        gid, uid = session.execute(select(Job.group_id, Job.user_id)).first()  # type: ignore[misc]
        late = add_job(session, gid, uid)
    schedule_tick(ctx, time.time())
    return ctx, late


def state_and_lease(ctx: ServerContext, job_id: int) -> tuple[str, str | None]:
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.state, job.lease_owner


def test_a_dispatch_tick_that_records_launches_skips_a_claim_read_younger_than_its_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, late = scheduled_behind_a_recording(tmp_path, monkeypatch)
    # "younger than its interval" however slowly the set-up ran on a busy box
    monkeypatch.setattr("corral.server.dispatch.DISPATCH_INTERVAL_S", 3600.0)
    with statements(ctx) as seen:
        dispatch_tick(ctx, time.time())
    # the two recorded: jobs and attempts read, jobs and attempts moved, events; no lease UPDATE
    # of its own and no read of the scheduled jobs (before: 7 statements)
    assert len(seen) == 5, seen
    assert not any("lease_owner=" in s and "state=" not in s for s in seen if s.startswith("UPDATE"))
    assert state_and_lease(ctx, late) == ("scheduled", None)
    launch_queue(ctx).pool.shutdown()


@pytest.mark.parametrize("why", ["interval passed", "cancel committed", "schedule loop asked"])
def test_a_dispatch_tick_that_records_launches_still_claims_when_due(
    why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another server's placement is claimed once the last read is an interval old; a committed
    cancel or the schedule loop (launch_placed, when it could not claim itself) gets it at once."""
    ctx, late = scheduled_behind_a_recording(tmp_path, monkeypatch)
    queue = launch_queue(ctx)
    if why == "interval passed":
        queue.claim_read_at = time.monotonic() - DISPATCH_INTERVAL_S
    elif why == "cancel committed":
        ctx.changed(Topic.CANCEL)
    else:
        ctx.wake("dispatch")  # as launch_placed does when it could not claim itself
    dispatch_tick(ctx, time.time())
    assert state_and_lease(ctx, late) == ("scheduled", ctx.owner_id)  # claimed, on the pool
    assert late in queue.busy_ids() or any(r[0] == late for r in queue.done)
    assert "dispatch" not in ctx.memory.asked
    queue.pool.shutdown()


def test_the_schedule_loop_probes_the_queue_only_when_its_last_cycle_left_none_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While its last cycle left jobs waiting, a cycle reads the snapshot at once (no "anything
    queued?" probe first); a cycle that placed every waiting job, or found none, turns the probe
    back on, and an idle queue costs that one probe per tick."""
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    ctx = cluster(tmp_path, 2, 10)  # 8 GPUs: the first cycle places 8, 2 wait
    schedule_tick(ctx, time.time())
    assert ctx.memory.queue_seen
    with statements(ctx) as waiting:
        schedule_tick(ctx, time.time())
    assert not any(s.startswith("SELECT jobs.id FROM jobs") for s in waiting), waiting
    assert ctx.memory.queue_seen  # placed nothing, 2 still wait
    with ctx.session_factory() as session:
        session.execute(update(Job).where(Job.state == "queued").values(state="cancelled"))
        session.commit()
    with statements(ctx) as emptied:
        schedule_tick(ctx, time.time())
    assert len(emptied) > 1 and not ctx.memory.queue_seen
    with statements(ctx) as idle:
        schedule_tick(ctx, time.time())
    assert len(idle) == 1 and idle[0].startswith("SELECT jobs.id FROM jobs"), idle
    with ctx.session_factory() as session:
        gid, uid = session.execute(select(Job.group_id, Job.user_id)).first()  # type: ignore[misc]
        late = add_job(session, gid, uid, gpus=0)  # the GPUs are taken; CPUs are not
    schedule_tick(ctx, time.time())  # the probe finds it, the cycle places it: none left waiting
    assert state_and_lease(ctx, late) == ("scheduled", None)
    assert not ctx.memory.queue_seen


def test_a_recording_tick_that_skips_the_read_returns_when_the_read_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick that records launches and skips the read of the scheduled jobs tells the runner
    when that read is due (the last read plus the interval), so that another server's placement
    is read once per interval and not a whole interval after the skip (before: ~0.33 s)."""
    ctx, late = scheduled_behind_a_recording(tmp_path, monkeypatch)
    # an interval no slow set-up or busy box can use up: the returned wait is checked in seconds
    monkeypatch.setattr("corral.server.dispatch.DISPATCH_INTERVAL_S", 3600.0)
    launch_queue(ctx).claim_read_at = time.monotonic() - 600.0  # read 10 minutes ago
    due = dispatch_tick(ctx, time.time())
    assert due is not None and 2900.0 < due <= 3000.0, due
    assert state_and_lease(ctx, late) == ("scheduled", None)  # skipped: not read, not claimed
    launch_queue(ctx).pool.shutdown()


class RecordedWaits(threading.Event):
    """A loop's wake event that notes how long the runner asked it to wait, and returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return True


def test_the_runner_waits_until_a_tick_says_it_is_due_but_never_past_its_interval(tmp_path: Path) -> None:
    """The runner rests min(interval, due) after a tick that returned `due`, none when the due
    time has passed, and the whole interval after a tick that returned None."""
    ctx = cluster(tmp_path, 1, 0)
    answers: list[float | None] = [5.0, None, 7200.0, -1.0]
    ticked = threading.Event()

    def tick(ctx: ServerContext, now: float) -> float | None:
        if not answers:
            ticked.set()
            return None
        return answers.pop(0)

    waits = RecordedWaits()
    ctx.wake_events["probe"] = waits
    runner = LoopRunner(ctx, [BackgroundLoop("probe", 3600.0, tick, singleton=False)])
    runner.start()
    try:
        assert ticked.wait(10)
    finally:
        runner.stop()
    assert waits.timeouts[:4] == [5.0, 3600.0, 3600.0, 0.0]


def test_a_claim_read_that_fails_is_asked_for_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of the scheduled jobs that raised (e.g. the database busy) leaves a claim asked for:
    the next tick reads, even one that only records launches within the interval."""
    ctx = cluster(tmp_path, 1, 0)

    def busy(*args: Any, **kwargs: Any) -> list[Any]:
        raise RuntimeError("database is locked")

    monkeypatch.setattr("corral.server.dispatch.prepare_launches", busy)
    with pytest.raises(RuntimeError):
        dispatch_tick(ctx, time.time())
    assert "dispatch" in ctx.memory.asked
