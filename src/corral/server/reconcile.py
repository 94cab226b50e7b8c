"""The reconcile loop: engine status -> job and attempt states.

Each tick: (once per process) re-adopt attempts launched before a restart; send the stops that
cancels and preemptions asked for; poll the engine for every live attempt; and record what changed,
in one transaction per tick (one per job only when that fails): the attempts that started and
those that succeeded as batches, in a few statements however many (`record_batch`), any other
end one by one. An ended attempt frees its GPUs in that transaction (see finish.py), and the
schedule loop is woken so the next job can start at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Float, Integer, String, cast, null, select, union_all
from sqlalchemy.orm import Session

from corral.db.models import Attempt, Job, UsageLedger
from corral.diagnosis.exitspec import ExitSpec, exit_spec_cache
from corral.diagnosis.logtail import failing_rank, read_tail
from corral.diagnosis.record import Diagnoser, failing_node, record, retry_rule
from corral.diagnosis.settings import DiagnosisSettings
from corral.engine.base import AttemptPhase, AttemptStatus, EngineUnavailable, FailureReason
from corral.server.ahead import queues_ahead
from corral.server.context import ServerContext
from corral.server.finish import end_attempt, end_attempts, end_values
from corral.server.snapshot import jobs_with_live_attempts, live_attempts
from corral.server.specview import read_spec
from corral.services.lifecycle import (
    DEFAULT_LOST_REQUEUE_BUDGET,
    AttemptEnd,
    AttemptState,
    Ending,
    JobState,
    Loss,
    RetryRule,
    cancelled_message,
    move_attempt,
    move_attempts,
    note_attempts_waiting,
    settle_attempt_end,
    succeeded_before_stop,
    success_values,
    transition,
    transition_jobs,
)
from corral.services.nodes import attempt_gpus
from corral.words import plural

log = logging.getLogger("corral.server.reconcile")


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


# Built once, since building a select cost about as much as running it on a small table
# (0.2-0.35 ms each).
LIVE_ROWS = (
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
        Job.state.in_([JobState.STARTING.value, JobState.RUNNING.value, JobState.PREEMPTED.value]),
        Attempt.state.in_([AttemptState.STARTING.value, AttemptState.RUNNING.value]),
    )
)
WAITING_STATES = (JobState.QUEUED.value, JobState.PREEMPTED.value)
# Every tick's reads in one statement (ten ticks a second, idle or not): the live attempts, then
# the waiting jobs with a cancel request, as rows whose attempt columns are NULL. Each was a
# statement of its own, and the cancelled jobs were loaded as whole ORM rows and committed every
# tick although there almost never are any.
TICK_ROWS = union_all(
    LIVE_ROWS,
    select(
        Job.id,
        cast(null(), Integer),
        cast(null(), String),
        cast(null(), String),
        Job.state,
        Job.cancel_requested,
        cast(null(), Float),
        cast(null(), Float),
    ).where(Job.cancel_requested.is_(True), Job.state.in_(WAITING_STATES)),
)


def _live_row(
    job_id: int,
    number: int,
    a_state: str,
    ref: str | None,
    j_state: str,
    cancel: object,
    stop_at: float | None,
    grace: float | None,
) -> LiveRow:
    return LiveRow(
        job_id, f"{job_id}.{number}", a_state, ref, j_state, bool(cancel), stop_at is not None, grace
    )


def _live_rows(session: Session) -> list[LiveRow]:
    """Plain columns, no ORM objects or spec parsing: this runs every tick for every live job."""
    return [_live_row(*row) for row in session.execute(LIVE_ROWS).all()]


def tick_rows(session: Session) -> tuple[list[LiveRow], list[int]]:
    """One statement: the live attempts, and the ids of waiting jobs with a cancel request."""
    live, cancelled = [], []
    for row in session.execute(TICK_ROWS).all():
        if row[1] is None:
            cancelled.append(int(row[0]))
        else:
            live.append(_live_row(*row))
    return live, cancelled


# How long the reconcile loop acts on live rows read at an earlier tick (docs/slurm.md, 2026-11-29
# round). Each tick read them (one SELECT and a rollback, ~1 ms of the server's CPU) although they
# change only when something asks this loop to look: a cancel or preemption committed (the
# services wake it), launches recorded (dispatch wakes it), its own writes (it reads again after
# any). A change that wakes nothing (another server's launches, a remediation's cancel) is seen
# at most this much later. Job ends are unaffected: the engine is polled at every tick.
ROWS_KEPT_S = 0.25


def tick_live_rows(ctx: ServerContext, now: float) -> list[LiveRow]:
    """The live attempts for this tick: those read at an earlier tick while no wake asked for a
    read and they are younger than ROWS_KEPT_S (only under a runner, whose loops are woken; a test
    driving ticks itself reads at every tick); else read (cancelling waiting jobs asked to)."""
    memory = ctx.memory
    asked = "reconcile" in memory.asked
    memory.asked.discard("reconcile")  # before the read: a wake after it is a read next tick
    kept = memory.reconcile_rows
    runner = "reconcile" in memory.lease_until
    if kept is not None and not asked and runner and time.monotonic() - kept[0] < ROWS_KEPT_S:
        return list(kept[1])
    read_at = time.monotonic()
    with ctx.session_factory() as session:
        rows, cancelled = tick_rows(session)
        if cancelled:
            cancel_queued(session, cancelled, now)
        session.rollback()
    memory.reconcile_rows = None if cancelled else (read_at, rows)
    return list(rows)


def adopt_once(ctx: ServerContext) -> None:
    """After a restart the engine is told which attempts it launched before (idempotent)."""
    if ctx.memory.adopted:
        return
    with ctx.session_factory() as session:
        refs = {r.attempt_id: r.engine_ref for r in _live_rows(session) if r.engine_ref}
    if refs:
        ctx.engine.adopt(refs)
        log.info("re-adopted %s", plural(len(refs), "running attempt"))
    ctx.memory.adopted = True


def cancel_queued(session: Session, job_ids: list[int], now: float) -> None:
    """These QUEUED/PREEMPTED jobs with a cancel request and nothing running: CANCELLED at once
    (each by compare-and-set: one may have been placed meanwhile)."""
    jobs = session.scalars(
        select(Job).where(Job.id.in_(job_ids), Job.cancel_requested.is_(True), Job.state.in_(WAITING_STATES))
    ).all()
    for job in jobs:
        if job.state == JobState.PREEMPTED.value and live_attempts(session, [job.id]):
            continue
        transition(session, job, JobState.CANCELLED, now=now, message=cancelled_message(job))
    session.commit()


def send_stops(ctx: ServerContext, rows: list[LiveRow]) -> bool:
    """Stop the attempts a cancel or preemption asked to stop; whether any was asked."""
    wanted = [r for r in rows if not r.stop_requested and (r.cancel_requested or r.job_state == "preempted")]
    if not wanted:
        return False
    with ctx.session_factory() as session:
        jobs, attempts = jobs_with_live_attempts(session, [r.job_id for r in wanted])
        for row in wanted:
            job, attempt = jobs.get(row.job_id), attempts.get(row.job_id)
            if job is None or attempt is None or attempt.attempt_id != row.attempt_id:
                continue
            grace = row.grace_s if row.grace_s is not None else read_spec(job.spec).stop_grace_s
            # The engine's clock, not the tick's: compared with the engine's end time (an exit 0
            # before the stop went out wins over preemption and cancel: services.lifecycle).
            attempt.stop_requested_at = time.time()
            ctx.engine.stop(row.attempt_id, grace)
            attempt.stop_grace_s = grace
        session.commit()
    return True


def _still_runs(status: AttemptStatus | None) -> bool:
    """Not seen ended by the engine (no status: stop it anyway, a stop is idempotent)."""
    return status is None or status.phase in (AttemptPhase.PENDING, AttemptPhase.RUNNING)


def _changes(row: LiveRow, status: AttemptStatus | None) -> bool:
    if status is None or status.phase is AttemptPhase.PENDING:
        return False
    return not (status.phase is AttemptPhase.RUNNING and row.attempt_state == AttemptState.RUNNING.value)


def loss_of(status: AttemptStatus) -> Loss:
    """What an engine's LOST status lost. The engines say it in words only (the label is for the
    reason people read; every kind of loss draws on the same budget)."""
    text = status.message.lower()
    if "supervisor" in text:
        return Loss.SUPERVISOR
    if "unknown to the" in text or "never launched" in text:
        return Loss.ENGINE
    return Loss.NODE if status.reason is FailureReason.NODE_LOST else Loss.ATTEMPT


def attempt_end(status: AttemptStatus, rule: RetryRule | None = None) -> AttemptEnd:
    """The engine's final status as the lifecycle rules read it (`rule`: the exit-spec's)."""
    code = (
        f"exit code {status.exit_code}"
        if status.exit_code is not None
        else (status.message or "no exit code")
    )
    why = f"{status.reason.value}: {code}" if status.reason else code
    if status.phase is AttemptPhase.SUCCEEDED:
        return AttemptEnd(Ending.SUCCEEDED, why, status.finished_at)
    if status.phase is AttemptPhase.LOST:
        return AttemptEnd(Ending.LOST, why, status.finished_at, loss=loss_of(status))
    return AttemptEnd(Ending.FAILED, why, status.finished_at, rule=rule)


def _record_running(session: Session, job: Job, attempt: Attempt, status: AttemptStatus, now: float) -> None:
    if attempt.state == AttemptState.RUNNING.value:
        return
    started = attempt.started_at or status.started_at or now
    moved = move_attempt(session, attempt, AttemptState.RUNNING, {"started_at": started, "message": ""})
    if moved and job.state == JobState.STARTING.value:
        transition(session, job, JobState.RUNNING, now=now)


def apply_status(
    session: Session,
    job_id: int,
    status: AttemptStatus,
    now: float,
    prefetched: tuple[Job | None, Attempt | None] | None = None,
    *,
    budget: int = DEFAULT_LOST_REQUEUE_BUDGET,
    diagnoser: Diagnoser | None = None,
) -> bool:
    """Record one engine status in the session (the caller commits); True when the attempt ended
    (its resources are free once committed). A job or attempt changed by another session since
    it was read is left alone: the next tick reads it again and decides on what is there."""
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
        _record_running(session, job, attempt, status, now)
        return False
    verdict = diagnoser.verdict(session, attempt, status) if diagnoser is not None else None
    rule = None
    if verdict is not None:
        rule = retry_rule(verdict, diagnoser.fault(session, attempt) if diagnoser else None)
    end = attempt_end(status, rule)
    attempt_state = settle_attempt_end(session, job, attempt, end, now=now, budget=budget)
    if attempt_state is None:
        return False
    reason: FailureReason | str | None = status.reason or (
        FailureReason.NODE_LOST if status.phase is AttemptPhase.LOST else None
    )
    if verdict is not None and attempt_state in (AttemptState.FAILED, AttemptState.LOST):
        node = failing_node(attempt, failing_rank(status.message))
        record(session, job, attempt, verdict, node, now, retried=job.state == JobState.QUEUED.value)
        reason = verdict.reason
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
    return True


Change = tuple[Job, Attempt, AttemptStatus]


def record_running(session: Session, started: list[Change], now: float) -> None:
    """Attempts the engine reports running: STARTING -> RUNNING (with when it started) for all of
    them in one compare-and-set, then their jobs still STARTING in one more, and their events in
    one INSERT. An attempt or job changed meanwhile loses alone; the others are written."""
    moving = []
    for job, attempt, status in started:
        if attempt.state != AttemptState.RUNNING.value:
            moving.append((job, attempt, attempt.started_at or status.started_at or now))
    won = move_attempts(
        session,
        [a for _, a, _ in moving],
        AttemptState.RUNNING,
        {a.id: {"started_at": t, "message": ""} for _, a, t in moving},  # no engine wait any more
    )
    jobs = [job for job, attempt, _ in moving if attempt.id in won and job.state == JobState.STARTING.value]
    transition_jobs(session, jobs, JobState.RUNNING, now=now)


def record_successes(session: Session, succeeded: list[Change], now: float) -> int:
    """Attempts that exited 0 before any stop (lifecycle rule 1): their jobs SUCCEEDED in one
    compare-and-set per state they were in, their attempts ended in one, their claims read in
    one SELECT (and deleted at the commit). A job changed meanwhile is left alone (the next tick
    reads it again); how many attempts ended."""
    jobs = [job for job, _, _ in succeeded]
    columns = {job.id: success_values(job) for job in jobs}
    won = transition_jobs(session, jobs, JobState.SUCCEEDED, now=now, values=columns)
    ends = []
    for job, attempt, status in succeeded:
        if job.id not in won:
            continue
        values = end_values(
            now,
            exit_code=status.exit_code,
            reason=status.reason,
            message=status.message,
            ended_at=status.finished_at,
        )
        if attempt.started_at is None and status.started_at is not None:
            values["started_at"] = status.started_at
        ends.append((job, attempt, values))
    end_attempts(session, ends, AttemptState.SUCCEEDED, now)
    return len(ends)


def record_batch(
    session: Session,
    changed: list[tuple[LiveRow, AttemptStatus]],
    prefetched: tuple[dict[int, Job], dict[int, Attempt]],
    now: float,
    *,
    budget: int,
    diagnoser: Diagnoser | None,
) -> int:
    """Record a tick's status changes in the caller's transaction: the attempts that started and
    those that succeeded as batches (the common moves, a few statements whatever their number),
    any other end one by one (`apply_status`: retries, losses, cancels, diagnosis). How many
    attempts ended."""
    jobs, attempts = prefetched
    started: list[Change] = []
    succeeded: list[Change] = []
    ended = 0
    for row, status in changed:
        job, attempt = jobs.get(row.job_id), attempts.get(row.job_id)
        if job is None or attempt is None or attempt.attempt_id != status.attempt_id:
            continue
        if status.phase is AttemptPhase.RUNNING:
            batch = started
        elif status.phase is AttemptPhase.SUCCEEDED and succeeded_before_stop(attempt, attempt_end(status)):
            batch = succeeded
        else:
            ended += apply_status(
                session, row.job_id, status, now, (job, attempt), budget=budget, diagnoser=diagnoser
            )
            continue
        if status.engine_ref and not attempt.engine_ref:  # as apply_status does
            attempt.engine_ref = status.engine_ref
        batch.append((job, attempt, status))
    record_running(session, started, now)
    return ended + record_successes(session, succeeded, now)


def _prefetch(
    session: Session, changed: list[tuple[LiveRow, AttemptStatus]]
) -> tuple[dict[int, Job], dict[int, Attempt]]:
    jobs, attempts = jobs_with_live_attempts(session, [row.job_id for row, _ in changed])
    ending = {row.job_id for row, status in changed if status.phase is not AttemptPhase.RUNNING}
    if any(
        attempt_gpus(a) > 0 for a in attempts.values() if a.job_id in ending
    ):  # only GPU-seconds are charged
        # The fair-share rows the ended attempts will charge, in one SELECT; kept referenced in
        # the session's info for the batch, since the identity map holds objects only weakly and
        # charge_usage's session.get would otherwise query each row again.
        session.info["usage_rows"] = {
            (r.group_name, r.user_name): r for r in session.scalars(select(UsageLedger))
        }
    return jobs, attempts


def _apply_alone(
    session: Session, row: LiveRow, status: AttemptStatus, budget: int, diagnoser: Diagnoser | None
) -> bool:
    try:
        ended = apply_status(session, row.job_id, status, time.time(), budget=budget, diagnoser=diagnoser)
        session.commit()
        return ended
    except Exception:
        session.rollback()
        log.exception("could not record status of job %s", row.job_id)
        return False


def make_diagnoser(ctx: ServerContext, statuses: list[AttemptStatus]) -> Diagnoser | None:
    """The exit-spec and the tails of the logs of the attempts that failed, read before the
    transaction (engine I/O, bounded: the last CORRAL_DIAG_LOG_TAIL_KIB of one rank each).
    None when no attempt ended badly."""
    if not any(s.phase in (AttemptPhase.FAILED, AttemptPhase.LOST) for s in statuses):
        return None
    spec = active_exit_spec(ctx)
    tails: dict[str, str] = {}
    for status in statuses:
        if status.phase is AttemptPhase.FAILED:
            rank = failing_rank(status.message)
            try:
                tails[status.attempt_id] = read_tail(
                    ctx.engine, status.attempt_id, rank, ctx.memory.log_tail_bytes
                )
            except (OSError, EngineUnavailable, ValueError) as exc:
                log.warning("could not read the log of %s for diagnosis: %s", status.attempt_id, exc)
    return Diagnoser(spec, tails)


def active_exit_spec(ctx: ServerContext) -> ExitSpec:
    """The exit-spec the loops use: loaded once per process, re-read when the admin file changes."""
    if ctx.memory.exit_spec is None:
        settings = DiagnosisSettings()
        ctx.memory.exit_spec = exit_spec_cache(settings.exit_spec_file)
        ctx.memory.log_tail_bytes = settings.log_tail_kib * 1024
    return ctx.memory.exit_spec.get()


def note_engine_waits(ctx: ServerContext, rows: list[LiveRow], statuses: Mapping[str, AttemptStatus]) -> None:
    """Why the engine holds an attempt it was handed (Slurm's pending reason: Resources, Priority,
    ReqNodeNotAvail...) on the attempt while it starts, for `corral show`, `why` and `logs`; without
    it a job Slurm held read "starting" with no word of why. Written when it changes, not at every
    tick (a pending attempt is polled ten times a second); RUNNING clears it (record_running)."""
    said = ctx.memory.engine_waits
    waits = {
        row.attempt_id: status.message
        for row in rows
        if row.attempt_state == AttemptState.STARTING.value
        and (status := statuses.get(row.attempt_id)) is not None
        and status.phase is AttemptPhase.PENDING
    }
    new = {aid: text for aid, text in waits.items() if said.get(aid, "") != text}
    ctx.memory.engine_waits = waits  # attempts no longer pending drop out
    if not new:
        return
    with ctx.session_factory() as session:
        note_attempts_waiting(session, new)
        session.commit()


def reconcile_tick(ctx: ServerContext, now: float) -> None:
    adopt_once(ctx)
    rows = tick_live_rows(ctx, now)
    if not rows:
        return
    try:
        # Poll first, then stop only what still runs: a stop sent to an attempt that has already
        # exited would stamp `stop_requested_at` after its end, and an exit 0 that came before any
        # stop would be read as the job answering the stop (requeued, run twice) instead of SUCCEEDED.
        statuses = ctx.engine.poll([r.attempt_id for r in rows])
        if send_stops(ctx, [r for r in rows if _still_runs(statuses.get(r.attempt_id))]):
            ctx.memory.reconcile_rows = None  # their stop_requested_at is written: read again
    except EngineUnavailable as exc:
        ctx.memory.reconcile_rows = None
        log.warning("engine unavailable; keeping job states as they are: %s", exc)
        return
    note_engine_waits(ctx, rows, statuses)
    changed = [(row, statuses[row.attempt_id]) for row in rows if _changes(row, statuses.get(row.attempt_id))]
    if not changed:
        return
    ctx.memory.reconcile_rows = None  # what is recorded below changes the rows: read again
    budget = ctx.settings.lost_requeue_budget
    diagnoser = make_diagnoser(ctx, [status for _, status in changed])
    with ctx.session_factory() as session:
        try:  # one transaction for the whole tick: one SQLite write however many jobs changed
            now = time.time()
            jobs, attempts = _prefetch(session, changed)
            with session.no_autoflush:  # rows were read first: the write lock is held only to commit
                ended = record_batch(
                    session, changed, (jobs, attempts), now, budget=budget, diagnoser=diagnoser
                )
            session.commit()
        except Exception:
            session.rollback()
            session.info.pop("usage_rows", None)  # one by one, each reads its own ledger row
            log.exception("batch of %d status changes failed; recording them one by one", len(changed))
            ended = sum(_apply_alone(session, row, status, budget, diagnoser) for row, status in changed)
    if any(status.phase is AttemptPhase.LOST for _, status in changed):
        # A lost attempt usually means a lost node: refresh node states too, so the requeued job
        # is not placed back on the node that just died.
        ctx.wake("nodes")
    started = any(status.phase is AttemptPhase.RUNNING for _, status in changed)
    if ended or (started and queues_ahead(ctx)):
        # Free resources; or, on an engine with its own queue, a job that started leaves its
        # slot to a successor placed ahead (server/ahead.py).
        ctx.wake("schedule")
