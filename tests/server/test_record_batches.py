"""The dispatch and reconcile loops record a batch of attempts that moved the same way (launched,
started, succeeded) in a fixed number of statements, however many there are; and a
compare-and-set that loses for one of them (its job or attempt changed by another session after
the loop read it) writes nothing of that one and loses none of the others' writes. Real SQLite
and the real loops over the fake engine."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, update
from sqlalchemy.orm.attributes import set_committed_value

from corral.db.models import Attempt, GpuClaim, Job, JobEvent, UsageLedger
from corral.db.session import make_engine
from corral.domain import JobDiagnosis
from corral.engine.base import AttemptPhase, AttemptStatus
from corral.server.context import ServerContext
from corral.server.dispatch import _record_all, dispatch_tick, launch_queue, launch_scheduled
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick, record_running, record_successes
from corral.server.scheduling import schedule_tick
from corral.server.snapshot import jobs_with_live_attempts
from corral.services.lifecycle import AttemptState, JobState, move_attempts, transition_jobs
from tests.pg import sqlite_or_postgres_url
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant
from tests.server.test_snapshot_queries import cluster


def launched(ctx: ServerContext, n: int) -> None:
    """Place every job and run their launches on the pool; the results wait to be recorded."""
    schedule_tick(ctx, time.time())
    launch_scheduled(ctx, launch_queue(ctx))
    queue = launch_queue(ctx)
    deadline = time.time() + 10
    while len(queue.done) < n and time.time() < deadline:
        time.sleep(0.01)
    assert len(queue.done) == n


def counted(ctx: ServerContext, tick: Any) -> int:
    """How many statements (reads and writes) one loop tick executes."""
    seen: list[str] = []
    db = ctx.session_factory.kw["bind"]

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(db, "before_cursor_execute", count)
    try:
        tick(ctx, time.time())
    finally:
        event.remove(db, "before_cursor_execute", count)
    return len(seen)


def fake_of(ctx: ServerContext) -> FakeEngine:
    assert isinstance(ctx.engine, FakeEngine)
    return ctx.engine


def test_recording_launches_starts_and_ends_costs_the_same_statements_for_2_jobs_as_for_8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    # the recording tick's read of the scheduled jobs, skipped while the last read is younger than
    # the interval (dispatch_tick), is not what this counts: never due here, on a slow box too
    monkeypatch.setattr("corral.server.dispatch.DISPATCH_INTERVAL_S", 3600.0)
    counts: dict[int, tuple[int, int, int]] = {}
    for n in (2, 8):
        ctx = cluster(tmp_path / f"c{n}", 2, n)  # 8 GPUs: every job placed at once
        ctx.memory.lease_until["dispatch"] = float("inf")
        launched(ctx, n)
        fake = fake_of(ctx)
        record = counted(ctx, dispatch_tick)
        for attempt_id in list(fake.launched):
            fake.run(attempt_id)
        starts = {a: fake.statuses[a].started_at for a in fake.launched}  # the engine's times
        running = counted(ctx, reconcile_tick)
        for attempt_id in list(fake.launched):
            fake.finish(attempt_id, 0)
        ends = {a: fake.statuses[a].finished_at for a in fake.launched}
        ended = counted(ctx, reconcile_tick)
        launch_queue(ctx).pool.shutdown()
        counts[n] = (record, running, ended)
        with ctx.session_factory() as session:
            jobs = session.scalars(select(Job)).all()
            attempts = session.scalars(select(Attempt)).all()
            events = Counter((e.job_id, e.to_state) for e in session.scalars(select(JobEvent)))
            ledger = session.scalars(select(UsageLedger)).all()
            claims = session.scalars(select(GpuClaim)).all()
        assert {(j.state, j.finished_at is not None, j.lease_owner) for j in jobs} == {
            ("succeeded", True, None)
        }
        assert len(attempts) == n
        for attempt in attempts:
            assert attempt.state == "succeeded" and attempt.exit_code == 0
            assert attempt.engine_ref == f"ref-{attempt.attempt_id}" and attempt.engine == "local"
            # the engine's start and end, not the ticks' (a slow tick on a busy box took 4 s)
            assert (
                attempt.started_at == starts[attempt.attempt_id]
                and attempt.ended_at == ends[attempt.attempt_id]
            )
        for job in jobs:  # each move once, with its event
            for state in ("scheduled", "starting", "running", "succeeded"):
                assert events[(job.id, state)] == 1, (job.id, state, events)
        assert claims == []  # every GPU freed
        ran = sum(end - starts[a] for a, end in ends.items() if end is not None)
        assert len(ledger) == 1 and ledger[0].gpu_seconds == pytest.approx(ran, rel=1e-6)
        assert all(j.attained_gpu_seconds > 0 for j in jobs)
    # before: 3 more statements per job in each of the three (job, attempt, event one by one)
    assert counts[2] == counts[8], counts


def started_copies(ctx: ServerContext, n: int) -> list[int]:
    """n jobs launched and recorded STARTING; their ids."""
    ctx.memory.lease_until["dispatch"] = float("inf")
    launched(ctx, n)
    dispatch_tick(ctx, time.time())
    launch_queue(ctx).pool.shutdown()
    with ctx.session_factory() as session:
        return sorted(session.scalars(select(Job.id).where(Job.state == "starting")))


def test_a_start_recorded_in_a_batch_loses_only_for_the_attempt_changed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    ctx = cluster(tmp_path, 2, 3)
    ids = started_copies(ctx, 3)
    assert len(ids) == 3
    with ctx.session_factory() as loop:
        jobs, attempts = jobs_with_live_attempts(loop, ids)  # the loop's copies: all starting
        with ctx.session_factory() as other:  # then another session loses the middle one's attempt
            other.execute(update(Attempt).where(Attempt.job_id == ids[1]).values(state="lost"))
            other.execute(update(Job).where(Job.id == ids[1]).values(state="queued"))
            other.commit()
        now = time.time()
        started = [
            (
                jobs[i],
                attempts[i],
                AttemptStatus(attempts[i].attempt_id, AttemptPhase.RUNNING, started_at=now - 2),
            )
            for i in ids
        ]
        with loop.no_autoflush:
            record_running(loop, started, now)
        loop.commit()
    with ctx.session_factory() as session:
        states = {a.job_id: (a.state, a.started_at) for a in session.scalars(select(Attempt))}
        job_states = {j.id: j.state for j in session.scalars(select(Job))}
        running = sorted(session.scalars(select(JobEvent.job_id).where(JobEvent.to_state == "running")))
    assert states[ids[0]] == ("running", pytest.approx(now - 2)) and states[ids[2]][0] == "running"
    assert states[ids[1]] == ("lost", None)  # nothing of the loser written
    assert job_states == {ids[0]: "running", ids[1]: "queued", ids[2]: "running"}
    assert running == [ids[0], ids[2]]


def test_a_success_recorded_in_a_batch_loses_only_for_the_job_changed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job settled by another session keeps its attempt and its GPU claim (whoever settled it
    frees them); the others end, free their GPUs and are charged."""
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    ctx = cluster(tmp_path, 2, 3)
    ids = started_copies(ctx, 3)
    with ctx.session_factory() as loop:
        jobs, attempts = jobs_with_live_attempts(loop, ids)
        loop.info["usage_rows"] = {(r.group_name, r.user_name): r for r in loop.scalars(select(UsageLedger))}
        with ctx.session_factory() as other:
            other.execute(update(Job).where(Job.id == ids[2]).values(state="failed"))
            other.commit()
        now = time.time()
        done = [
            (
                jobs[i],
                attempts[i],
                AttemptStatus(
                    attempts[i].attempt_id, AttemptPhase.SUCCEEDED, 0, started_at=now - 3, finished_at=now - 1
                ),
            )
            for i in ids
        ]
        with loop.no_autoflush:
            assert record_successes(loop, done, now) == 2
        loop.commit()
    with ctx.session_factory() as session:
        attempts_now = {a.job_id: a for a in session.scalars(select(Attempt))}
        job_states = {j.id: j.state for j in session.scalars(select(Job))}
        claims = sorted(c.job_id for c in session.scalars(select(GpuClaim)))
        ledger = session.scalars(select(UsageLedger)).all()
        ends = sorted(session.scalars(select(JobEvent.job_id).where(JobEvent.to_state == "succeeded")))
    assert job_states == {ids[0]: "succeeded", ids[1]: "succeeded", ids[2]: "failed"}
    for i in ids[:2]:
        a = attempts_now[i]
        assert (a.state, a.exit_code, a.started_at, a.ended_at) == ("succeeded", 0, now - 3, now - 1)
    assert attempts_now[ids[2]].state == "starting" and attempts_now[ids[2]].ended_at is None
    assert claims == [ids[2]]
    assert ends == ids[:2]
    assert len(ledger) == 1 and ledger[0].gpu_seconds == pytest.approx(4.0)  # 2 jobs x 1 GPU x 2 s


def test_a_launch_recorded_in_a_batch_stops_only_the_job_settled_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    ctx = cluster(tmp_path, 2, 3)
    ctx.memory.lease_until["dispatch"] = float("inf")
    launched(ctx, 3)
    queue = launch_queue(ctx)
    queue.pool.shutdown()
    results = queue.take_done()
    victim = sorted(r[0] for r in results)[0]
    with ctx.session_factory() as session:  # its node went down meanwhile: settled, not starting
        session.execute(update(Job).where(Job.id == victim).values(state="queued"))
        session.commit()
    with ctx.session_factory() as session:
        assert session.get(Job, victim).state == "queued"  # type: ignore[union-attr]
    # the loop read the victim's row as scheduled: the batch's compare-and-set is what finds out
    real = jobs_with_live_attempts

    def stale(session: Any, ids: Any) -> Any:
        jobs, attempts = real(session, ids)
        # the copy the loop read before the other session wrote (not a write: committed value)
        set_committed_value(jobs[victim], "state", "scheduled")
        return jobs, attempts

    monkeypatch.setattr("corral.server.dispatch.jobs_with_live_attempts", stale)
    with ctx.session_factory() as session, session.no_autoflush:
        _record_all(ctx, session, results)
    fake = fake_of(ctx)
    with ctx.session_factory() as session:
        job_states = {j.id: j.state for j in session.scalars(select(Job))}
        attempt_states = {a.job_id: (a.state, a.engine_ref) for a in session.scalars(select(Attempt))}
    others = sorted(set(job_states) - {victim})
    assert job_states == {victim: "queued", **dict.fromkeys(others, "starting")}
    for job_id in others:
        assert attempt_states[job_id][0] == "starting" and attempt_states[job_id][1] is not None
    assert attempt_states[victim] == ("scheduled", None)
    assert [a for a, _ in fake.stopped] == [f"{victim}.1"]  # no orphan process left running


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sqlite_or_postgres_url(request, tmp_path, "db.sqlite")


def test_a_batch_writes_each_rows_own_values_and_leaves_unnamed_columns_as_they_were(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of one batch in different states (one UPDATE each), columns that only some rows
    name (the others keep theirs), values that differ by row, SQL NULL for a cleared diagnosis;
    and a row changed meanwhile, not written."""
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    fake = FakeEngine([gpu_node("n0")])
    ctx = make_context(make_engine(db_url), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        ids = [add_job(session, gid, uid) for _ in range(3)]
    schedule_tick(ctx, time.time())
    with ctx.session_factory() as session:  # job 0 with a diagnosis, job 2 back in the queue
        session.execute(
            update(Job).where(Job.id == ids[0]).values(diagnosis=JobDiagnosis((), 3, None), reason="old")
        )
        session.execute(update(Job).where(Job.id == ids[2]).values(state="queued"))
        session.commit()
    with ctx.session_factory() as loop:
        jobs, attempts = jobs_with_live_attempts(loop, ids)
        with ctx.session_factory() as other:  # attempt 1 ended by another session meanwhile
            other.execute(update(Attempt).where(Attempt.job_id == ids[1]).values(state="lost"))
            other.commit()
        now = time.time()
        moved = move_attempts(
            loop,
            [attempts[i] for i in ids],
            AttemptState.STARTING,
            {
                attempts[ids[0]].id: {"engine_ref": "r0", "engine": "e0"},
                attempts[ids[2]].id: {"engine": "x"},
            },
        )
        assert moved == {attempts[ids[0]].id, attempts[ids[2]].id}
        won = transition_jobs(
            loop, [jobs[i] for i in ids], JobState.FAILED, now=now, values={ids[1]: {"reason": "mine"}}
        )
        assert won == set(ids)
        loop.commit()
    with ctx.session_factory() as session:
        rows = {a.job_id: (a.state, a.engine_ref, a.engine) for a in session.scalars(select(Attempt))}
        job_rows = {
            j.id: (j.state, j.reason, j.finished_at, j.diagnosis) for j in session.scalars(select(Job))
        }
        events = sorted(
            (e.job_id, e.from_state, e.to_state)
            for e in session.scalars(select(JobEvent).where(JobEvent.to_state == "failed"))
        )
        cleared = session.scalar(select(Job.id).where(Job.id == ids[0], Job.diagnosis.is_(None)))
    assert rows == {
        ids[0]: ("starting", "r0", "e0"),
        ids[1]: ("lost", None, "local"),  # as placed: nothing of the loser written
        ids[2]: ("starting", None, "x"),
    }
    assert job_rows == {
        ids[0]: ("failed", "old", now, None),
        ids[1]: ("failed", "mine", now, None),
        ids[2]: ("failed", "", now, None),  # as it was
    }
    assert cleared == ids[0]  # SQL NULL, not JSON null
    assert events == [
        (ids[0], "scheduled", "failed"),
        (ids[1], "scheduled", "failed"),
        (ids[2], "queued", "failed"),
    ]


def test_a_batch_larger_than_one_statement_writes_every_row_in_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is written CAS_BATCH_ROWS rows per UPDATE (a per-row CASE is quadratic in the
    rows): every row gets its own value, across the chunks, and a row changed meanwhile in a
    later chunk loses alone."""
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    monkeypatch.setattr("corral.services.lifecycle.CAS_BATCH_ROWS", 2)
    ctx = make_context(
        make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), FakeEngine([gpu_node("n0")]), str(tmp_path)
    )
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        ids = [add_job(session, gid, uid) for _ in range(4)]  # n0's 4 GPUs
    schedule_tick(ctx, time.time())
    db = ctx.session_factory.kw["bind"]
    updates: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE ATTEMPTS"):
            updates.append(statement)

    with ctx.session_factory() as loop:
        _, attempts = jobs_with_live_attempts(loop, ids)
        with ctx.session_factory() as other:  # the fourth row, in the second chunk, ends meanwhile
            other.execute(update(Attempt).where(Attempt.job_id == ids[3]).values(state="lost"))
            other.commit()
        event.listen(db, "before_cursor_execute", count)
        try:
            moved = move_attempts(
                loop,
                [attempts[i] for i in ids],
                AttemptState.STARTING,
                {attempts[i].id: {"engine_ref": f"r{k}"} for k, i in enumerate(ids)},
            )
        finally:
            event.remove(db, "before_cursor_execute", count)
        loop.commit()
    assert len(updates) == 2  # 2 + 2 rows
    assert moved == {attempts[i].id for k, i in enumerate(ids) if k != 3}
    with ctx.session_factory() as session:
        rows = {a.job_id: (a.state, a.engine_ref) for a in session.scalars(select(Attempt))}
    assert rows == {i: ("lost", None) if k == 3 else ("starting", f"r{k}") for k, i in enumerate(ids)}
