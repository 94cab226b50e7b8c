"""The lifecycle rules on the real loops (SQLite, FakeEngine): compare-and-set state writes,
the exit-0-while-preempted rule, and a cancel racing the scheduling cycle."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm.attributes import set_committed_value

from corral.db.models import Attempt, Gpu, GpuClaim, Job, JobEvent, UsageLedger, User
from corral.db.session import make_engine
from corral.scheduler import types as st
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.scheduling import apply_assignments, apply_preemption
from corral.server.snapshot import read_cluster_state
from corral.services.auth import Principal
from corral.services.jobs import cancel_job
from corral.services.lifecycle import (
    Loss,
    move_attempt,
    move_gpu,
    request_cancel,
    settle_failure,
    settle_lost_work,
    transition,
)
from corral.services.nodes import cluster_summary
from corral.services.states import (
    ATTEMPT_TRANSITIONS,
    JOB_TRANSITIONS,
    TERMINAL_STATES,
    AttemptState,
    GpuHealth,
    InvalidTransition,
    JobState,
)
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


def job_reason(ctx: ServerContext, job_id: int) -> str | None:
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.reason


RECLAIM = "reclaimed by group nlp for job 9: this job ran on borrowed quota"
ALICE = Principal(user_id=0, name="alice", is_admin=True, default_group_id=None)  # an admin


def stop_and_settle(ctx: ServerContext, fake: FakeEngine, job_id: int) -> None:
    """The reconcile loop sends the stop a cancel or a preemption asked for, the attempt ends on
    SIGTERM (143), and the next tick settles the job."""
    reconcile_tick(ctx, time.time())
    fake.finish(f"{job_id}.1", 143)
    reconcile_tick(ctx, time.time())


def test_a_preempted_job_says_why_while_it_stops_and_once_back_in_the_queue(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """`corral show` prints the job's reason: it said "preempted; back in the queue" and only the
    events (which no CLI command prints) named the job or group it made room for."""
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        assert apply_preemption(session, st.Preemption(str(job_id), 5.0, RECLAIM), time.time())
    assert job_reason(ctx, job_id) == RECLAIM
    stop_and_settle(ctx, fake, job_id)
    assert job_state(ctx, job_id) == "queued"
    assert job_reason(ctx, job_id) == f"{RECLAIM}; back in the queue"


def test_a_preempted_job_whose_work_ended_before_the_stop_does_not_read_as_stopped(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        assert apply_preemption(session, st.Preemption(str(job_id), 5.0, RECLAIM), time.time())
    fake.finish(f"{job_id}.1", 0)
    time.sleep(0.01)
    reconcile_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "succeeded"
    assert job_reason(ctx, job_id) == "its work ended (exit 0) before the preemption stopped it"


def test_a_running_job_cancelled_by_someone_else_says_who(env: tuple[ServerContext, FakeEngine]) -> None:
    """A group admin (or an admin, an offboarding, a rule, an idle policy) cancelling a user's
    running job left it 'reason: cancelled by request' in `corral show`; who asked was only in
    the events."""
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        cancel_job(session, ALICE, job_id)
    assert job_reason(ctx, job_id) == "cancel requested by alice"
    stop_and_settle(ctx, fake, job_id)
    assert job_state(ctx, job_id) == "cancelled"
    assert job_reason(ctx, job_id) == "cancel requested by alice"


def test_a_job_being_cancelled_and_then_preempted_still_says_who_cancelled_it(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        cancel_job(session, ALICE, job_id)
    with ctx.session_factory() as session:  # a running job being cancelled is still a victim
        assert apply_preemption(session, st.Preemption(str(job_id), 5.0, RECLAIM), time.time())
    stop_and_settle(ctx, fake, job_id)
    assert job_state(ctx, job_id) == "cancelled"
    assert job_reason(ctx, job_id) == "cancel requested by alice"


@pytest.mark.parametrize(
    ("asked", "end", "state", "says"),
    [
        ("cancel", "lost", "cancelled", "cancel requested by alice; node lost: n1 silent"),
        ("cancel", "failed", "cancelled", "cancel requested by alice; launch failed"),
        ("preempt", "lost", "queued", f"{RECLAIM}; node lost (n1 silent); back in the queue"),
    ],
)
def test_a_cancelled_or_preempted_job_whose_work_is_lost_or_fails_still_says_who_or_what(
    env: tuple[ServerContext, FakeEngine], asked: str, end: str, state: str, says: str
) -> None:
    """The CANCELLED end of lost or failed work (a node lost: server/nodes.py; a launch failed:
    server/dispatch.py) and the requeue of a preempted job whose node was lost repeat the words of
    the request or the preemption, as an attempt's ordinary end does: they said 'cancelled; node
    lost: ...', 'cancelled; launch failed' and 'preempted; node lost (...); back in the queue'."""
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        if asked == "cancel":
            cancel_job(session, ALICE, job_id)
        else:
            assert apply_preemption(session, st.Preemption(str(job_id), 5.0, RECLAIM), time.time())
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        if end == "lost":
            assert settle_lost_work(session, job, loss=Loss.NODE, why="n1 silent", now=time.time())
        else:
            assert settle_failure(session, job, why="launch failed", now=time.time())
        session.commit()
    assert job_state(ctx, job_id) == state
    assert job_reason(ctx, job_id) == says


def test_a_cancel_committed_after_the_preemptions_read_keeps_its_words(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """The PREEMPTED transition keeps a cancel's words (d0def6d) by its copy of the job; a cancel
    committed after that copy was read (the schedule loop read the job, then a group admin's cancel
    committed, then the loop's compare-and-set on the state alone) was written over all the same,
    and the job ended CANCELLED 'reclaimed by group nlp ...'. The UPDATE itself keeps them."""
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)  # the preemption's copy: no cancel asked for yet
        assert job is not None and not job.cancel_requested
        with ctx.session_factory() as other:
            cancel_job(other, ALICE, job_id)
        _stale(job, "running")  # (SQLite: the copy as PostgreSQL's READ COMMITTED leaves it)
        set_committed_value(job, "cancel_requested", False)
        assert transition(session, job, JobState.PREEMPTED, now=time.time(), message=RECLAIM)
        session.commit()
    assert job_reason(ctx, job_id) == "cancel requested by alice"
    stop_and_settle(ctx, fake, job_id)
    assert job_state(ctx, job_id) == "cancelled"
    assert job_reason(ctx, job_id) == "cancel requested by alice"


def test_a_stop_asked_for_a_job_that_ended_meanwhile_leaves_its_end_alone(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """request_cancel (an idle policy's or a remediation rule's stop, a cancel) wrote the flag and
    its words through the caller's copy, whatever the row said by then: a job that failed after
    the idle loop read it read 'GPUs still idle ...: stopped' in `corral show`, its failure's words
    gone. The write now needs the job not ended, as the row reads at the UPDATE."""
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)  # the idle loop's copy: running
        assert job is not None
        fake.finish(f"{job_id}.1", 3)
        reconcile_tick(ctx, time.time())  # the job fails meanwhile
        _stale(job, "running")
        assert not request_cancel(session, job, now=time.time(), why="GPUs still idle: stopped")
        session.commit()
    assert job_state(ctx, job_id) == "failed"
    assert job_reason(ctx, job_id) == "attempt 1 failed (exit code 3)"
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and not job.cancel_requested


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


def test_exit_0_after_the_preemption_stop_was_sent_is_a_stop_and_requeues(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """A job that checkpoints and exits 0 on SIGTERM has not finished its work."""
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        assert apply_preemption(session, st.Preemption(str(job_id), 5.0, "reclaimed"), time.time())
    reconcile_tick(ctx, time.time())  # sends the stop
    assert fake.stopped == [(f"{job_id}.1", 5.0)]
    time.sleep(0.01)
    fake.finish(f"{job_id}.1", 0)
    reconcile_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "queued"
    assert attempts_of(ctx, job_id) == [(1, "preempted")]
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and (job.preemptions, job.own_failures, job.platform_losses) == (1, 0, 0)


def lose(ctx: ServerContext, fake: FakeEngine, job_id: int, number: int) -> None:
    """Place, launch and run attempt `number`, then the engine forgets it (poll says LOST)."""
    with ctx.session_factory() as session:
        assert apply_assignments(session, [assignment(job_id)], time.time()) == 1
    run_dispatch(ctx)
    fake.run(f"{job_id}.{number}")
    reconcile_tick(ctx, time.time())
    del fake.statuses[f"{job_id}.{number}"]
    reconcile_tick(ctx, time.time())


def test_lost_work_is_requeued_within_one_budget_then_fails_without_using_retries(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    ctx, fake = env
    ctx.settings.lost_requeue_budget = 2
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, retries=5, preemptible=False)
    for number in (1, 2):
        lose(ctx, fake, job_id, number)
        assert job_state(ctx, job_id) == "queued"
    lose(ctx, fake, job_id, 3)
    assert job_state(ctx, job_id) == "failed"  # 5 retries left: losses do not draw on them
    assert attempts_of(ctx, job_id) == [(1, "lost"), (2, "lost"), (3, "lost")]
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and (job.platform_losses, job.own_failures) == (3, 0)
        assert (
            job.reason
            == "attempt lost: attempt 3 (no exit code); lost 3 times, over the platform-loss budget of 2"
        )


def test_retries_count_only_the_jobs_own_failures(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, retries=1)
    lose(ctx, fake, job_id, 1)  # a platform loss: free of retries
    with ctx.session_factory() as session:
        assert apply_assignments(session, [assignment(job_id)], time.time()) == 1
    run_dispatch(ctx)
    fake.run(f"{job_id}.2")
    reconcile_tick(ctx, time.time())
    with ctx.session_factory() as session:  # a preemption: free of retries
        assert apply_preemption(session, st.Preemption(str(job_id), 1.0, "reclaimed"), time.time())
    reconcile_tick(ctx, time.time())
    fake.finish(f"{job_id}.2", 143)
    reconcile_tick(ctx, time.time())
    for number in (3, 4):  # own failures: the first is retry 1 of 1, the second is final
        assert job_state(ctx, job_id) == "queued"
        with ctx.session_factory() as session:
            assert apply_assignments(session, [assignment(job_id)], time.time()) == 1
        run_dispatch(ctx)
        fake.finish(f"{job_id}.{number}", 3)
        reconcile_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "failed"
    assert attempts_of(ctx, job_id) == [(1, "lost"), (2, "preempted"), (3, "failed"), (4, "failed")]
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert (job.own_failures, job.platform_losses, job.preemptions) == (2, 1, 1)
        assert job.reason == "attempt 4 failed (exit code 3)"


def _stale(obj: object, state: str) -> None:
    """Make the session's copy say `state` whatever the row says (a copy read before a commit)."""
    set_committed_value(obj, "state", state)


@pytest.mark.parametrize("final", sorted(TERMINAL_STATES))
def test_a_terminal_job_state_is_final_even_for_a_stale_copy(
    env: tuple[ServerContext, FakeEngine], final: JobState
) -> None:
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and transition(session, job, final, now=time.time())
        session.commit()
        events = len(session.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).all())
        for target in JobState:
            _stale(job, final.value)
            with pytest.raises(InvalidTransition):  # the table refuses it first ...
                transition(session, job, target, now=time.time())
            _stale(job, JobState.RUNNING.value)  # ... and a copy read before the end cannot win
            if target in JOB_TRANSITIONS[JobState.RUNNING]:
                assert not transition(session, job, target, now=time.time(), message="late")
        session.commit()
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == final.value
        assert len(session.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).all()) == events


@pytest.mark.parametrize("final", [s for s in AttemptState if s.finished])
def test_an_ended_attempt_is_final_even_for_a_stale_copy(
    env: tuple[ServerContext, FakeEngine], final: AttemptState
) -> None:
    ctx, fake = env
    job_id = running_job(ctx, fake)
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert move_attempt(session, attempt, final)
        session.commit()
        for target in AttemptState:
            _stale(attempt, final.value)
            with pytest.raises(InvalidTransition):
                move_attempt(session, attempt, target)
            _stale(attempt, AttemptState.RUNNING.value)
            if target in ATTEMPT_TRANSITIONS[AttemptState.RUNNING]:
                assert not move_attempt(session, attempt, target)
        session.commit()
    assert attempts_of(ctx, job_id) == [(1, final.value)]


def test_a_failure_the_exit_spec_calls_not_retryable_fails_with_retries_left(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    ctx, _fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        retried, final = add_job(session, gid, uid, retries=2), add_job(session, gid, uid, retries=2)
    with ctx.session_factory() as session:
        assert apply_assignments(session, [assignment(retried), assignment(final, "n2")], time.time()) == 2
        jobs = {j.id: j for j in session.scalars(select(Job))}
        assert settle_failure(session, jobs[retried], why="exit 1", now=time.time()) is JobState.QUEUED
        verdict = settle_failure(session, jobs[final], why="exit 1", now=time.time(), retryable=False)
        assert verdict is JobState.FAILED
        session.commit()
    assert (job_state(ctx, retried), job_state(ctx, final)) == ("queued", "failed")


def test_a_quarantined_gpu_is_not_offered_to_the_scheduler(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, _fake = env
    with ctx.session_factory() as session:
        gpu = session.get(Gpu, ("n1", 2))
        assert gpu is not None and gpu.health == "healthy"
        assert move_gpu(session, gpu, GpuHealth.QUARANTINED)
        set_committed_value(gpu, "health", "healthy")  # a copy read before the quarantine ...
        assert not move_gpu(session, gpu, GpuHealth.LOST)  # ... loses against it
        session.commit()
    node_tick(ctx, time.time())  # the engine's next report does not undo Corral's verdict
    with ctx.session_factory() as session:
        state = read_cluster_state(session)
        summary = cluster_summary(session)
    n1 = next(n for n in state.nodes if n.name == "n1")
    assert [g.healthy for g in n1.gpus] == [True, True, False, True]
    assert summary["gpus"]["free"] == 7 and summary["gpus"]["by_model"]["VGPU"]["unavailable"] == 1


def test_one_reconcile_batch_ends_two_attempts_of_a_new_user(
    env: tuple[ServerContext, FakeEngine], caplog: pytest.LogCaptureFixture
) -> None:
    """Both charge the user's new fair-share row in the batch (it used to add the row twice, fail
    on its primary key and redo the batch one job at a time)."""
    ctx, fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        jobs = [add_job(session, gid, uid), add_job(session, gid, uid)]
    with ctx.session_factory() as session:
        placed = [assignment(jobs[0], "n1"), assignment(jobs[1], "n2")]
        assert apply_assignments(session, placed, time.time()) == 2
    run_dispatch(ctx)
    for job_id in jobs:
        fake.finish(f"{job_id}.1", 0)
    reconcile_tick(ctx, time.time())
    assert [job_state(ctx, j) for j in jobs] == ["succeeded", "succeeded"]
    assert "one by one" not in caplog.text
    with ctx.session_factory() as session:
        ledger = session.get(UsageLedger, ("g", "u"))
        assert ledger is not None and ledger.gpu_seconds == pytest.approx(2.0, rel=0.1)
