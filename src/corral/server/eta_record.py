"""The live side of the estimated-start calibration (corral.scheduler.eta_calibration, the same
code the simulator uses): the schedule loop records the first wait its roll predicted for a job
(`jobs.eta_shown_at`, `jobs.eta_shown_wait_s`, migration 0032), and once the job's first attempt
is placed, (predicted, actual) is one outcome; the estimates it writes to `Job.diagnosis` (what
`GET /jobs/{id}`, `corral why` and the job page show) are the roll's with their waits from now
corrected by those outcomes. A job whose size class and cluster have too few outcomes
(eta_calibration.MIN_OUTCOMES) gets the roll's estimate unchanged.

The calibration lives in the loop's memory (`LoopMemory.eta_calibration`), fed as this server
places jobs; a restarted server (or the first tick) rebuilds it from the last LOADED_OUTCOMES
outcomes in the database, so nothing the platform has seen is lost with the process.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from corral.db.base import table_of
from corral.db.models import Attempt, Job
from corral.scheduler import types as st
from corral.scheduler.eta_calibration import WINDOW, EtaCalibration
from corral.server.context import ServerContext
from corral.services.lifecycle import JobState

# Outcomes read when the calibration is rebuilt: several windows, so the common size classes get
# a full one (a rare class falls back to the cluster's fit until it has MIN_OUTCOMES of its own).
LOADED_OUTCOMES = 8 * WINDOW


def load_outcomes(session: Session, calibration: EtaCalibration, limit: int = LOADED_OUTCOMES) -> int:
    """Record into `calibration` the last `limit` started jobs that were shown an estimate, oldest
    first (the order they happened in); how many."""
    first = select(Attempt.job_id, Attempt.created_at).where(Attempt.number == 1).subquery()
    rows = session.execute(
        select(Job.gpus, Job.eta_shown_at, Job.eta_shown_wait_s, first.c.created_at)
        .join(first, first.c.job_id == Job.id)
        .where(Job.eta_shown_at.is_not(None), Job.eta_shown_wait_s.is_not(None))
        .order_by(first.c.created_at.desc())
        .limit(limit)
    ).all()
    for gpus, shown_at, wait_s, started_at in reversed(rows):
        calibration.record(gpus or 0, wait_s, started_at - shown_at)
    return len(rows)


def calibration_of(ctx: ServerContext, session: Session) -> EtaCalibration:
    """The loop's calibration, rebuilt from the database the first time it is asked for."""
    found = ctx.memory.eta_calibration
    if found is None:
        found = EtaCalibration()
        load_outcomes(session, found)
        ctx.memory.eta_calibration = found
    return found


def note_started(ctx: ServerContext, session: Session, job_ids: Collection[str], now: float) -> None:
    """The jobs of this tick's assignments that were placed for the first time, and had been shown
    an estimate, are outcomes: started `now`. (A calibration not built yet is built from the
    database, these jobs included, so none is counted twice.)"""
    if not job_ids:
        return
    if ctx.memory.eta_calibration is None:
        calibration_of(ctx, session)
        return
    calibration = ctx.memory.eta_calibration
    rows = session.execute(
        select(Job.gpus, Job.eta_shown_at, Job.eta_shown_wait_s).where(
            Job.id.in_([int(j) for j in job_ids]),
            Job.attempt_count == 1,
            Job.state != JobState.QUEUED.value,  # placed: not a job whose assignment lost
            Job.eta_shown_at.is_not(None),
            Job.eta_shown_wait_s.is_not(None),
        )
    ).all()
    for gpus, shown_at, wait_s in rows:
        if shown_at is not None and wait_s is not None:  # the query says so; the types do not
            calibration.record(gpus or 0, wait_s, now - shown_at)


def note_shown(session: Session, predicted_waits: Mapping[str, float], now: float) -> None:
    """Record each job's first predicted wait (the roll's) and `now`, unless one is recorded
    already (a job back in the queue keeps its first). Not committed: the caller's transaction."""
    if not predicted_waits:
        return
    jobs = table_of(Job)
    stmt = (
        update(jobs)
        .where(jobs.c.id == bindparam("job_pk"), jobs.c.eta_shown_at.is_(None))
        .values(eta_shown_at=now, eta_shown_wait_s=bindparam("wait_s"))
    )
    session.execute(stmt, [{"job_pk": int(j), "wait_s": max(0.0, w)} for j, w in predicted_waits.items()])


def calibrated(calibration: EtaCalibration, diagnosis: st.Diagnosis, gpus: int, now: float) -> st.Diagnosis:
    """The diagnosis with its estimated start and range corrected (each end mapped through the
    same increasing fit, so the range still holds the estimate)."""
    if diagnosis.estimated_start is None:
        return diagnosis
    start = calibration.corrected_start(now, gpus, diagnosis.estimated_start)
    span = diagnosis.start_range
    if span is not None:
        span = (
            calibration.corrected_start(now, gpus, span[0]),
            calibration.corrected_start(now, gpus, span[1]),
        )
    return replace(diagnosis, estimated_start=start, start_range=span)
