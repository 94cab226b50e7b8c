"""Estimated starts in the live loop, on a real SQLite database with a fake engine: a job held by
its user's cap says so and gets no time (it used to get a time in the past); a job behind running
work whose runtimes have a spread gets a start range; the API view, the logs' waiting status and
the CLI's line all say the same; after jobs started later than they were told, the next estimate
shown is corrected by those outcomes (scheduler/eta_calibration.py, server/eta_record.py)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from corral.cli.jobs import start_line
from corral.db.models import Attempt, Group, Job, User
from corral.db.session import make_engine
from corral.domain import JobDiagnosis
from corral.engine.base import NodeReport
from corral.scheduler.eta import LIMIT_STOP_S
from corral.scheduler.eta_calibration import EtaCalibration
from corral.server.context import ServerContext
from corral.server.eta_record import calibration_of, load_outcomes
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.runner import core_loops
from corral.server.scheduling import _same_diagnosis, schedule_tick
from corral.services.auth import Principal
from corral.services.holds import hold_job, release_job
from corral.services.job_logs import waiting_status
from corral.services.views import job_view
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, run_dispatch, seed_tenant


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


@pytest.mark.parametrize(("basis", "left"), [("limit", LIMIT_STOP_S), ("cluster", 0.0), (None, 0.0)])
def test_a_job_past_its_max_runtime_is_expected_gone_after_its_stop(
    ctx: ServerContext, basis: str | None, left: float
) -> None:
    """A running job estimated at 600 s without a spread has run 1,000 s. When its estimate was
    its own max_runtime (basis "limit", the column the snapshot reads), it is being stopped: the
    GPUs come back after the stop, not "now", which the next job was shown at every cycle. A
    point guess (a row from before the spread was recorded) keeps the old rule, "now" (the tail
    rule for it was measured and not kept: docs/simulator.md "Round 5")."""
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        running = add_job(session, gid, uid, gpus=4, name="long")
        job = session.get(Job, running)
        assert job is not None
        job.runtime_estimate_s, job.runtime_estimate_basis = 600.0, basis
        session.commit()
    now = time.time()
    schedule_tick(ctx, now)  # `long` takes every GPU (placed at `now`: its start, to the loop)
    with ctx.session_factory() as session:
        waiting = add_job(session, gid, uid, gpus=4, name="next")
    schedule_tick(ctx, now + 1000)
    d = _shown(ctx, waiting).diagnosis
    assert d is not None and d.estimated_start is not None
    assert d.estimated_start == pytest.approx(now + 1000 + left, abs=1e-3)


def _run_to_end(ctx: ServerContext, fake: FakeEngine, job_id: int, started_at: float | None = None) -> None:
    """The placed job through the real dispatch and reconcile loops: launched, running (the
    engine's start: `started_at`, None a second ago), succeeded."""
    run_dispatch(ctx)
    fake.run(f"{job_id}.1", started_at)
    reconcile_tick(ctx, time.time())
    fake.finish(f"{job_id}.1", 0)
    reconcile_tick(ctx, time.time())


def _shown(ctx: ServerContext, job_id: int) -> Job:
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


@pytest.mark.parametrize("profile", ["default", "fifo"])
def test_after_jobs_started_later_than_predicted_the_next_estimate_shown_is_corrected(
    tmp_path: Path, profile: str
) -> None:
    """Under `fifo` (Profile.eta_calibration False) the same outcomes are recorded, but the roll's
    estimate is shown as it is."""
    fake = FakeEngine([gpu_node("n1", gpus=4)])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    ctx.settings.scheduler_profile = profile
    node_tick(ctx, time.time())
    # the real calibration, trusted from 3 outcomes instead of MIN_OUTCOMES (30) to keep the test short
    ctx.memory.eta_calibration = EtaCalibration(min_outcomes=3)
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        blocker = add_job(session, gid, uid, gpus=4, name="blocker")
    t0 = time.time()
    schedule_tick(ctx, t0)  # `blocker` takes the node's 4 GPUs
    with ctx.session_factory() as session:
        waiting = [add_job(session, gid, uid, gpus=4, name=f"w{i}") for i in range(3)]
    schedule_tick(ctx, t0 + 1)  # each is shown an estimate; too little history: the roll's own
    for job_id in waiting:
        job = _shown(ctx, job_id)
        assert job.eta_shown_at == t0 + 1 and job.eta_shown_wait_s is not None
        assert job.diagnosis is not None and job.diagnosis.estimated_start is not None
        assert job.diagnosis.estimated_start == pytest.approx(t0 + 1 + job.eta_shown_wait_s, abs=1e-3)
    # each starts 50,000 s after it was shown its estimate: far later than any of them was told
    # (placed at once when the one before ends; the engine's start is the outcome)
    late = t0 + 1 + 50_000
    previous = blocker
    for job_id in waiting:
        _run_to_end(ctx, fake, previous, None if previous == blocker else late)
        schedule_tick(ctx, late)
        assert _shown(ctx, job_id).state == "scheduled"
        previous = job_id
    run_dispatch(ctx)
    fake.run(f"{previous}.1", late)
    reconcile_tick(ctx, time.time())
    with ctx.session_factory() as session:
        probe = add_job(session, gid, uid, gpus=4, name="probe")
    now = t0 + 50_002
    schedule_tick(ctx, now)
    job = _shown(ctx, probe)
    assert job.eta_shown_at == now and job.eta_shown_wait_s is not None
    raw = now + job.eta_shown_wait_s
    # the same correction from the outcomes in the database (what a restarted server rebuilds),
    # both made by the 4-GPU class's own fit: the outcomes' size (Job.gpus) is the probe's class
    rebuilt = EtaCalibration(min_outcomes=3)
    with ctx.session_factory() as session:
        assert load_outcomes(session, rebuilt, now) == 3
    live = ctx.memory.eta_calibration
    assert live is not None and live.outcomes(4) == rebuilt.outcomes(4) == 3
    assert live.outcomes(1) == rebuilt.outcomes(1) == 0
    assert job.diagnosis is not None and job.diagnosis.estimated_start is not None
    if profile == "fifo":
        assert job.diagnosis.estimated_start == pytest.approx(raw, abs=1e-3)
        return
    expected = rebuilt.corrected_start(now, 4, raw)
    assert job.diagnosis.estimated_start == pytest.approx(expected, abs=1.0)
    assert job.diagnosis.estimated_start > raw + 10_000  # later than the roll says, as they all were
    assert ctx.memory.eta_since[str(probe)] == now  # its later estimates fade from here
    with ctx.session_factory() as session:
        view = job_view(session.get(Job, probe))  # type: ignore[arg-type]  # what GET /jobs/{id} returns
        assert view["diagnosis"] is not None
        assert view["diagnosis"]["estimated_start"] == job.diagnosis.estimated_start


def _outcomes_rebuilt(ctx: ServerContext, now: float) -> int:
    with ctx.session_factory() as session:
        return load_outcomes(session, EtaCalibration(), now)


def test_a_job_back_in_the_queue_after_a_placement_is_no_outcome_live_or_rebuilt(tmp_path: Path) -> None:
    """A job placed at once, then requeued (here: it failed, with a retry left) and waiting behind
    another, is shown an estimate on its second wait; that wait followed no estimate shown before
    its first placement, so neither the live calibration nor the one rebuilt counts it."""
    fake = FakeEngine([gpu_node("n1", gpus=4)])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        retried = add_job(session, gid, uid, gpus=4, retries=1, name="retried")
    t0 = time.time()
    schedule_tick(ctx, t0)  # placed without waiting: never shown an estimate
    with ctx.session_factory() as session:
        waiting = add_job(session, gid, uid, gpus=4, name="waiting")
        job = session.get(Job, waiting)
        assert job is not None
        job.priority = 2  # high: it goes before the retry
        session.commit()
    schedule_tick(ctx, t0 + 1)  # `waiting` is shown one
    assert _shown(ctx, waiting).eta_shown_at == t0 + 1
    run_dispatch(ctx)
    fake.run(f"{retried}.1")
    reconcile_tick(ctx, time.time())
    fake.finish(f"{retried}.1", 1)  # fails: back in the queue for its retry
    reconcile_tick(ctx, time.time())
    assert _shown(ctx, retried).state == "queued"
    schedule_tick(ctx, t0 + 100)  # `waiting` takes the node: an outcome once it starts
    assert _shown(ctx, waiting).state == "scheduled"
    schedule_tick(ctx, t0 + 101)  # `retried` waits behind it and gets an estimate, not recorded
    job = _shown(ctx, retried)
    assert job.state == "queued" and job.attempt_count == 1
    assert job.diagnosis is not None and job.diagnosis.estimated_start is not None
    assert job.eta_shown_at is None and job.eta_shown_wait_s is None
    _run_to_end(ctx, fake, waiting, t0 + 100)  # started as placed
    schedule_tick(ctx, t0 + 5000)  # `retried` placed again: not its first placement
    assert _shown(ctx, retried).state == "scheduled"
    live = ctx.memory.eta_calibration
    assert live is not None and live.outcomes() == 1
    assert _outcomes_rebuilt(ctx, t0 + 5000) == 1


def _two_shown_behind_a_blocker(
    tmp_path: Path, *names: str
) -> tuple[ServerContext, FakeEngine, float, tuple[int, int, int]]:
    """A 4-GPU node taken by `blocker` at t0, and two 4-GPU jobs behind it, each shown an estimate
    at t0 + 1: (ctx, engine, t0, (blocker, first, second))."""
    fake = FakeEngine([gpu_node("n1", gpus=4)])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        blocker = add_job(session, gid, uid, gpus=4, name="blocker")
    t0 = time.time()
    schedule_tick(ctx, t0)
    with ctx.session_factory() as session:
        first, second = (add_job(session, gid, uid, gpus=4, name=n) for n in names)
    schedule_tick(ctx, t0 + 1)
    return ctx, fake, t0, (blocker, first, second)


def test_the_outcome_is_the_engines_start_and_a_job_never_started_is_none(tmp_path: Path) -> None:
    """Two jobs wait behind a blocker and are shown estimates. The first is placed 99 s later but
    the engine starts it only 4,999 s after it was shown one (on Slurm a job may wait in the
    engine's queue): the outcome is 4,999 s, what its user saw, live and rebuilt, not the
    placement's 99 s. The second is placed once the first ends, and its launch fails: it never
    started, so it is no outcome."""
    ctx, fake, t0, (blocker, late, failed) = _two_shown_behind_a_blocker(tmp_path, "late", "failed")
    shown_wait = _shown(ctx, late).eta_shown_wait_s
    assert _shown(ctx, late).eta_shown_at == _shown(ctx, failed).eta_shown_at == t0 + 1
    _run_to_end(ctx, fake, blocker)
    schedule_tick(ctx, t0 + 100)  # `late` placed; `failed` waits
    assert _shown(ctx, late).state == "scheduled"
    live = ctx.memory.eta_calibration
    assert live is not None and live.outcomes() == 0  # placed, not started: no outcome yet
    _run_to_end(ctx, fake, late, t0 + 5000)
    fake.fail_launch = "no such image"
    schedule_tick(ctx, t0 + 5001)  # `failed` placed (and `late`'s start read)
    assert _shown(ctx, failed).state == "scheduled"
    run_dispatch(ctx)
    reconcile_tick(ctx, time.time())
    job = _shown(ctx, failed)
    assert job.state != "scheduled" and job.attempt_count == 1
    with ctx.session_factory() as session:
        (attempt,) = session.scalars(select(Attempt).where(Attempt.job_id == failed)).all()
        assert attempt.started_at is None  # it never ran
        live = calibration_of(ctx, session, t0 + 5002)
        rebuilt = EtaCalibration(min_outcomes=1)
        assert load_outcomes(session, rebuilt, t0 + 5002) == 1
    assert live.outcomes() == 1
    assert shown_wait is not None
    fitted = rebuilt.corrected_wait(4, shown_wait)  # one outcome: shown wait -> the wait that followed
    assert fitted is not None and fitted == pytest.approx(4999.0, abs=1e-6)


def test_a_tick_with_no_new_start_reads_only_the_window_count_and_a_late_commit_is_still_read(
    tmp_path: Path,
) -> None:
    """note_started re-read and joined every first attempt started in its look back (LATE_START_S)
    at every schedule tick, ~25 ms a tick with 2,000 there. With nothing new in the window (its
    latest start and count unchanged) it reads the index's count alone; a start committed late,
    earlier than the latest one but inside the window, still moves the count and is recorded."""
    ctx, fake, t0, (blocker, first, second) = _two_shown_behind_a_blocker(tmp_path, "first", "second")
    _run_to_end(ctx, fake, blocker)
    schedule_tick(ctx, t0 + 2)
    _run_to_end(ctx, fake, first, t0 + 60)
    schedule_tick(ctx, t0 + 3)  # `second` placed; `first`'s start read
    live = ctx.memory.eta_calibration
    assert live is not None and live.outcomes() == 1
    db = ctx.session_factory.kw["bind"]
    seen: list[str] = []

    def note(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    with ctx.session_factory() as session:
        event.listen(db, "before_cursor_execute", note)
        try:
            calibration_of(ctx, session, t0 + 4)
        finally:
            event.remove(db, "before_cursor_execute", note)
    assert len(seen) == 1 and "count(" in seen[0].lower() and "jobs" not in seen[0].lower(), seen
    # `second` starts before `first` did (t0 + 30 < t0 + 60): not a new latest start, but in the window
    _run_to_end(ctx, fake, second, t0 + 30)
    with ctx.session_factory() as session:
        calibration_of(ctx, session, t0 + 5)
    assert live.outcomes() == 2


def test_a_hold_forgets_the_shown_estimate_and_the_job_is_measured_from_its_next(tmp_path: Path) -> None:
    fake = FakeEngine([gpu_node("n1", gpus=4)])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        blocker = add_job(session, gid, uid, gpus=4, name="blocker")
    t0 = time.time()
    schedule_tick(ctx, t0)
    with ctx.session_factory() as session:
        held = add_job(session, gid, uid, gpus=4, name="held")
    schedule_tick(ctx, t0 + 1)
    assert _shown(ctx, held).eta_shown_at == t0 + 1
    with ctx.session_factory() as session:
        user = session.get(User, uid)
        assert user is not None
        owner = Principal(uid, user.name, False, gid, {gid: "member"})
        assert hold_job(session, owner, held, now=t0 + 2)["changed"]
    job = _shown(ctx, held)
    assert job.held_by == uid and job.eta_shown_at is None and job.eta_shown_wait_s is None
    schedule_tick(ctx, t0 + 3)  # held: no input, nothing shown or recorded
    assert _shown(ctx, held).eta_shown_at is None
    with ctx.session_factory() as session:
        assert release_job(session, owner, held, now=t0 + 86_400)["changed"]
    schedule_tick(ctx, t0 + 86_401)  # measured again from its first estimate after the release
    job = _shown(ctx, held)
    assert job.eta_shown_at == t0 + 86_401 and job.eta_shown_wait_s is not None
    shown_wait = job.eta_shown_wait_s
    _run_to_end(ctx, fake, blocker)
    schedule_tick(ctx, t0 + 86_500)
    assert _shown(ctx, held).state == "scheduled"
    run_dispatch(ctx)
    fake.run(f"{held}.1", t0 + 86_500)  # the engine starts it at once
    reconcile_tick(ctx, time.time())
    # one outcome of 99 s (not the day on hold), the same live (brought up to date as the loop
    # does before it shows an estimate) and rebuilt
    rebuilt = EtaCalibration(min_outcomes=1)
    with ctx.session_factory() as session:
        live = calibration_of(ctx, session, t0 + 86_501)
        assert load_outcomes(session, rebuilt, t0 + 86_501) == 1
    assert live.outcomes() == 1
    # one outcome: the fit is the plain ratio, which maps the shown wait onto the wait that followed
    fitted = rebuilt.corrected_wait(4, shown_wait)
    assert fitted is not None and fitted == pytest.approx(99.0, abs=1e-6)


def test_a_long_wait_is_rewritten_only_when_it_moved_by_more_than_a_hundredth() -> None:
    now = 1_000_000.0
    old = JobDiagnosis(reasons=(), queue_position=1, estimated_start=now + 36_000.0)

    def moved(by: float) -> JobDiagnosis:
        return replace(old, estimated_start=now + 36_000.0 + by)

    assert _same_diagnosis(old, moved(359.0), now)  # under 1% of the 10 h it showed
    assert not _same_diagnosis(old, moved(361.0), now)
    near = replace(old, estimated_start=now + 60.0)
    assert _same_diagnosis(near, replace(near, estimated_start=now + 64.0), now)  # 5 s at least
    assert not _same_diagnosis(near, replace(near, estimated_start=now + 66.0), now)


def test_getting_the_schedule_lease_back_rebuilds_the_calibration_and_rewrites_diagnoses(
    ctx: ServerContext,
) -> None:
    (schedule,) = [loop for loop in core_loops() if loop.name == "schedule"]
    ctx.memory.eta_calibration = EtaCalibration()
    ctx.memory.diagnoses["7"] = JobDiagnosis(reasons=(), queue_position=1, estimated_start=1.0)
    ctx.memory.eta_since["7"] = 1.0
    assert schedule.on_lease is not None
    schedule.on_lease(ctx)
    assert ctx.memory.eta_calibration is None and not ctx.memory.diagnoses and not ctx.memory.eta_since


def _cpu_job(session: Session, gid: int, uid: int, name: str, cpus: float) -> int:
    """A CPU-only job (a workspace's kind) asking for `cpus` CPUs."""
    job_id = add_job(session, gid, uid, gpus=0, name=name)
    job = session.get(Job, job_id)
    assert job is not None
    task = job.spec.tasks["worker"]
    task = task.model_copy(update={"resources": task.resources.model_copy(update={"cpus": cpus})})
    job.spec = job.spec.model_copy(update={"tasks": {"worker": task}})
    session.commit()
    return job_id


def test_a_cpu_job_behind_a_cpu_hungry_running_job_is_not_told_now(tmp_path: Path) -> None:
    """The walk's `corral ws show nb`: a CPU-only job on a node whose CPUs a running job holds
    was shown "estimated start in ~0 s". Its start is the running job's expected end."""
    fake = FakeEngine([NodeReport(name="c1", cpus=16, memory_mib=65536, address="10.0.0.9")])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4)
        hog = _cpu_job(session, gid, uid, "hog", cpus=16)
        job = session.get(Job, hog)
        assert job is not None
        job.runtime_estimate_s = 3600.0
        session.commit()
    now = time.time()
    schedule_tick(ctx, now)  # `hog` takes every CPU
    with ctx.session_factory() as session:
        assert session.get(Job, hog).state == "scheduled"  # type: ignore[union-attr]
        nb = _cpu_job(session, gid, uid, "nb", cpus=2)
    schedule_tick(ctx, now + 1)
    with ctx.session_factory() as session:
        job = session.get(Job, nb)
        assert job is not None and job.state == "queued" and job.diagnosis is not None
        d = job.diagnosis
        assert [r.code for r in d.reasons] == ["insufficient_cpu_memory"]
        assert d.estimated_start is not None
        # the hog's 3,600 s from its start (it has run about 1 s): not now + 1
        assert now + 3000 < d.estimated_start < now + 3700
        view = job_view(job)
        assert view["diagnosis"] is not None
        assert view["diagnosis"]["estimated_start"] == d.estimated_start
        assert "(in ~0 s)" not in start_line(dict(view["diagnosis"]))
