"""The reconcile loop: engine status -> job and attempt states.

Each tick: (once per process) re-adopt attempts launched before a restart; send the stops that
cancels and preemptions asked for; poll the engine for every live attempt; and record what changed,
one transaction per job. An ended attempt frees its GPUs in that transaction (see finish.py), and
the schedule loop is woken so the next job can start at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.models import Attempt, Job, UsageLedger
from corral.engine.base import AttemptPhase, AttemptStatus, EngineUnavailable, FailureReason
from corral.server.context import ServerContext
from corral.server.finish import end_attempt
from corral.server.snapshot import jobs_with_live_attempts, live_attempts
from corral.server.specview import read_spec
from corral.services.lifecycle import AttemptState, JobState, transition

log = logging.getLogger("corral.server.reconcile")
MAX_LOST_REQUEUES = 10  # a job whose attempts keep vanishing stops being requeued for free


@dataclass(frozen=True, slots=True)
class LiveRow:
    job_id: int
    attempt_id: str
    attempt_state: str
    engine_ref: str | None
    job_state: str
    cancel_requested: bool
    stop_requested: bool
    grace_s: float | None  # None: the spec's stop_grace (read only when a stop is sent)


def _live_rows(session: Session) -> list[LiveRow]:
    """Plain columns, no ORM objects or spec parsing: this runs every tick for every live job."""
    states = [JobState.STARTING.value, JobState.RUNNING.value, JobState.PREEMPTED.value]
    rows = session.execute(
        select(
            Job.id,
            Attempt.number,
            Attempt.state,
            Attempt.engine_ref,
            Job.state,
            Job.cancel_requested,
            Attempt.stop_requested_at,
            Attempt.stop_grace_s,
        )
        .join(Attempt, Attempt.job_id == Job.id)
        .where(
            Job.state.in_(states),
            Attempt.state.in_([AttemptState.STARTING.value, AttemptState.RUNNING.value]),
        )
    ).all()
    return [
        LiveRow(job_id, f"{job_id}.{number}", a_state, ref, j_state, bool(cancel), stop_at is not None, grace)
        for job_id, number, a_state, ref, j_state, cancel, stop_at, grace in rows
    ]


def adopt_once(ctx: ServerContext) -> None:
    """After a restart the engine is told which attempts it launched before (idempotent)."""
    if ctx.memory.adopted:
        return
    with ctx.session_factory() as session:
        refs = {r.attempt_id: r.engine_ref for r in _live_rows(session) if r.engine_ref}
    if refs:
        ctx.engine.adopt(refs)
        log.info("re-adopted %d running attempt(s)", len(refs))
    ctx.memory.adopted = True


def cancel_queued(ctx: ServerContext, session: Session, now: float) -> None:
    """QUEUED/PREEMPTED jobs with a cancel request and nothing running: CANCELLED at once."""
    jobs = session.scalars(
        select(Job).where(
            Job.cancel_requested.is_(True), Job.state.in_([JobState.QUEUED.value, JobState.PREEMPTED.value])
        )
    ).all()
    for job in jobs:
        if job.state == JobState.PREEMPTED.value and live_attempts(session, [job.id]):
            continue
        transition(session, job, JobState.CANCELLED, now=now, message="cancelled by request")
    session.commit()


def send_stops(ctx: ServerContext, rows: list[LiveRow], now: float) -> None:
    wanted = [r for r in rows if not r.stop_requested and (r.cancel_requested or r.job_state == "preempted")]
    if not wanted:
        return
    with ctx.session_factory() as session:
        jobs, attempts = jobs_with_live_attempts(session, [r.job_id for r in wanted])
        for row in wanted:
            job, attempt = jobs.get(row.job_id), attempts.get(row.job_id)
            if job is None or attempt is None or attempt.attempt_id != row.attempt_id:
                continue
            grace = row.grace_s if row.grace_s is not None else read_spec(job.spec).stop_grace_s
            ctx.engine.stop(row.attempt_id, grace)
            attempt.stop_requested_at = now
            attempt.stop_grace_s = grace
        session.commit()


def _changes(row: LiveRow, status: AttemptStatus | None) -> bool:
    if status is None or status.phase is AttemptPhase.PENDING:
        return False
    return not (status.phase is AttemptPhase.RUNNING and row.attempt_state == AttemptState.RUNNING.value)


def _end_target(job: Job, status: AttemptStatus) -> tuple[AttemptState, JobState, str]:
    code = (
        f"exit code {status.exit_code}"
        if status.exit_code is not None
        else (status.message or "no exit code")
    )
    why = f"{status.reason.value}: {code}" if status.reason else code
    if job.cancel_requested:
        return AttemptState.CANCELLED, JobState.CANCELLED, "cancelled by request"
    if job.state == JobState.PREEMPTED.value:
        return AttemptState.PREEMPTED, JobState.QUEUED, "preempted; back in the queue"
    if status.phase is AttemptPhase.SUCCEEDED:
        return AttemptState.SUCCEEDED, JobState.SUCCEEDED, ""
    if status.phase is AttemptPhase.LOST:
        if job.preemptible and job.attempt_count < MAX_LOST_REQUEUES:
            return AttemptState.LOST, JobState.QUEUED, f"attempt {job.attempt_count} lost ({why}); requeued"
        return AttemptState.LOST, JobState.FAILED, f"attempt {job.attempt_count} lost ({why})"
    return AttemptState.FAILED, JobState.FAILED, f"attempt {job.attempt_count} failed ({why})"


def apply_status(
    session: Session,
    job_id: int,
    status: AttemptStatus,
    now: float,
    prefetched: tuple[Job | None, Attempt | None] | None = None,
) -> bool:
    """Record one engine status in the session (the caller commits); True when the attempt ended
    (its resources are free once committed)."""
    if prefetched is None:
        job = session.get(Job, job_id, populate_existing=True)
        attempt = live_attempts(session, [job_id]).get(job_id) if job else None
    else:
        job, attempt = prefetched
    if job is None or attempt is None or attempt.attempt_id != status.attempt_id:
        return False
    if status.phase is AttemptPhase.PENDING:
        return False
    if attempt.started_at is None and status.started_at is not None:
        attempt.started_at = status.started_at
    if status.engine_ref and not attempt.engine_ref:
        attempt.engine_ref = status.engine_ref
    if status.phase is AttemptPhase.RUNNING:
        if attempt.state == AttemptState.RUNNING.value:
            return False
        attempt.state = AttemptState.RUNNING.value
        attempt.started_at = attempt.started_at or now
        if job.state == JobState.STARTING.value:
            transition(session, job, JobState.RUNNING, now=now)
        return False
    attempt_state, target, message = _end_target(job, status)
    reason = status.reason or (FailureReason.NODE_LOST if status.phase is AttemptPhase.LOST else None)
    end_attempt(
        session,
        job,
        attempt,
        attempt_state,
        now,
        exit_code=status.exit_code,
        reason=reason,
        message=status.message,
        ended_at=status.finished_at,
    )
    transition(session, job, target, now=now, message=message)
    return True


def _prefetch(session: Session, ids: list[int]) -> tuple[dict[int, Job], dict[int, Attempt]]:
    session.scalars(select(UsageLedger)).all()  # fair-share rows the ended attempts will charge
    return jobs_with_live_attempts(session, ids)


def _apply_alone(session: Session, row: LiveRow, status: AttemptStatus) -> bool:
    try:
        ended = apply_status(session, row.job_id, status, time.time())
        session.commit()
        return ended
    except Exception:
        session.rollback()
        log.exception("could not record status of job %s", row.job_id)
        return False


def reconcile_tick(ctx: ServerContext, now: float) -> None:
    adopt_once(ctx)
    with ctx.session_factory() as session:
        cancel_queued(ctx, session, now)
        rows = _live_rows(session)
        session.rollback()
    if not rows:
        return
    try:
        send_stops(ctx, rows, now)
        statuses = ctx.engine.poll([r.attempt_id for r in rows])
    except EngineUnavailable as exc:
        log.warning("engine unavailable; keeping job states as they are: %s", exc)
        return
    changed = [(row, statuses[row.attempt_id]) for row in rows if _changes(row, statuses.get(row.attempt_id))]
    if not changed:
        return
    with ctx.session_factory() as session:
        try:  # one transaction for the whole tick: one SQLite write however many jobs changed
            now = time.time()
            jobs, attempts = _prefetch(session, [row.job_id for row, _ in changed])
            with session.no_autoflush:  # rows were read first: the write lock is held only to commit
                ended = sum(
                    apply_status(
                        session, row.job_id, status, now, (jobs.get(row.job_id), attempts.get(row.job_id))
                    )
                    for row, status in changed
                )
            session.commit()
        except Exception:
            session.rollback()
            log.exception("batch of %d status changes failed; recording them one by one", len(changed))
            ended = sum(_apply_alone(session, row, status) for row, status in changed)
    if any(status.phase is AttemptPhase.LOST for _, status in changed):
        # A lost attempt usually means a lost node: refresh node states too, so the requeued job
        # is not placed back on the node that just died.
        ctx.wake("nodes")
    if ended:
        ctx.wake("schedule")
