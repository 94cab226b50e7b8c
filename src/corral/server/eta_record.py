"""The live side of the estimated-start calibration (corral.scheduler.eta_calibration, the same
code the simulator uses): the schedule loop records the first wait its roll predicted for a job
that was never placed (`jobs.eta_shown_at`, `jobs.eta_shown_wait_s`, migration 0032), and once
the job's first attempt is placed, (predicted, actual) is one outcome. A hold forgets the shown
estimate (lifecycle.hold: the job is measured from its first estimate after the release), and so
does a placement ahead of a freed slot (server/ahead.py: such a job starts when the job before it
ends, later than its placement, so it is no outcome). The estimates the loop writes to
`Job.diagnosis` (what `GET /jobs/{id}`, `corral why` and the job page show) are the roll's with
their waits from now corrected by those outcomes: the first in full, each later one less as the job waits
(eta_calibration.faded, from when this server first showed it one: `LoopMemory.eta_since`). A job
whose size class and cluster have too few outcomes (eta_calibration.MIN_OUTCOMES) gets the roll's
estimate unchanged.

The calibration lives in the loop's memory (`LoopMemory.eta_calibration`), fed as this server
places jobs; a restarted server, the first tick, or a server that gets the schedule lease back
(runner.py: another server scheduled meanwhile) rebuilds it from the outcomes in the database:
the last LOADED_OUTCOMES of the last LOADED_SPAN_S, the same pairs the live path records. A
long-running server may still hold older outcomes of a rare size class than a rebuilt one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from corral.db.base import table_of
from corral.db.models import Attempt, Job
from corral.scheduler import types as st
from corral.scheduler.eta_calibration import WINDOW, EtaCalibration, EtaFits
from corral.server.context import ServerContext
from corral.services.lifecycle import JobState

# Outcomes read when the calibration is rebuilt: several windows, so the common size classes get
# a full one (a rare class falls back to the cluster's fit until it has MIN_OUTCOMES of its own).
LOADED_OUTCOMES = 8 * WINDOW
# ... placed in the last 30 days at most: the read stays an index range (attempts (number,
# created_at), migration 0032) on a database of millions of attempts, and a wait measured under a
# month-old queue says little about today's.
LOADED_SPAN_S = 30 * 86400.0


def load_outcomes(
    session: Session, calibration: EtaCalibration, now: float, limit: int = LOADED_OUTCOMES
) -> int:
    """Record into `calibration` the last `limit` jobs whose first attempt was placed after they
    were shown an estimate (in the LOADED_SPAN_S before `now`), oldest first (the order they
    happened in); how many."""
    first = (
        select(Attempt.job_id, Attempt.created_at)
        .where(Attempt.number == 1, Attempt.created_at >= now - LOADED_SPAN_S)
        .subquery()
    )
    rows = session.execute(
        select(Job.gpus, Job.eta_shown_at, Job.eta_shown_wait_s, first.c.created_at)
        .join(first, first.c.job_id == Job.id)
        .where(
            Job.eta_shown_at.is_not(None),
            Job.eta_shown_wait_s.is_not(None),
            # shown before its first placement (note_shown records no other; rows written before
            # it checked that are left out here)
            first.c.created_at >= Job.eta_shown_at,
        )
        .order_by(first.c.created_at.desc())
        .limit(limit)
    ).all()
    for gpus, shown_at, wait_s, started_at in reversed(rows):
        calibration.record(gpus or 0, wait_s, started_at - shown_at)
    return len(rows)


def calibration_of(ctx: ServerContext, session: Session, now: float) -> EtaCalibration:
    """The loop's calibration, rebuilt from the database the first time it is asked for."""
    found = ctx.memory.eta_calibration
    if found is None:
        found = EtaCalibration()
        load_outcomes(session, found, now)
        ctx.memory.eta_calibration = found
    return found


def note_started(ctx: ServerContext, session: Session, placed: Collection[int], now: float) -> None:
    """The jobs this tick placed (`placed`: their ids, as scheduling.place_assignments returns
    them) for the first time, and that had been shown an estimate, are outcomes: started `now`.
    (A calibration not built yet is built from the database, these jobs included, so none is
    counted twice.)"""
    if not placed:
        return
    if ctx.memory.eta_calibration is None:
        calibration_of(ctx, session, now)
        return
    calibration = ctx.memory.eta_calibration
    rows = session.execute(
        select(Job.gpus, Job.eta_shown_at, Job.eta_shown_wait_s).where(
            Job.id.in_(list(placed)),
            Job.attempt_count == 1,  # its first placement is this one
            Job.eta_shown_at.is_not(None),
            Job.eta_shown_wait_s.is_not(None),
        )
    ).all()
    for gpus, shown_at, wait_s in rows:
        if shown_at is not None and wait_s is not None:  # the query says so; the types do not
            calibration.record(gpus or 0, wait_s, now - shown_at)


def note_shown(session: Session, predicted_waits: Mapping[str, float], now: float) -> None:
    """Record each job's first predicted wait (the roll's) and `now`, only for a job never placed,
    still queued and not held (the diagnosis write's own conditions: a job held since the snapshot
    was shown nothing), and unless one is recorded already. A job back in the queue after a
    placement (a retry, a preemption) is no outcome: its wait did not follow an estimate shown
    before its first start. Not committed: the caller's transaction."""
    if not predicted_waits:
        return
    jobs = table_of(Job)
    stmt = (
        update(jobs)
        .where(
            jobs.c.id == bindparam("job_pk"),
            jobs.c.eta_shown_at.is_(None),
            jobs.c.attempt_count == 0,
            jobs.c.state == JobState.QUEUED.value,
            jobs.c.held_by.is_(None),
        )
        .values(eta_shown_at=now, eta_shown_wait_s=bindparam("wait_s"))
    )
    session.execute(stmt, [{"job_pk": int(j), "wait_s": max(0.0, w)} for j, w in predicted_waits.items()])


def calibrated(
    fits: EtaFits, diagnosis: st.Diagnosis, gpus: int, now: float, elapsed_s: float = 0.0
) -> st.Diagnosis:
    """The diagnosis with its estimated start and range corrected, `elapsed_s` after the job was
    first shown one (eta_calibration.faded: the correction fades as the job waits). The range
    still holds the estimate."""
    if diagnosis.estimated_start is None:
        return diagnosis
    start = _corrected_start(fits, now, gpus, diagnosis.estimated_start, elapsed_s)
    span = diagnosis.start_range
    if span is not None:
        early = _corrected_start(fits, now, gpus, span[0], elapsed_s)
        late = _corrected_start(fits, now, gpus, span[1], elapsed_s)
        span = (min(early, start), max(late, start))
    return replace(diagnosis, estimated_start=start, start_range=span)


def _corrected_start(fits: EtaFits, now: float, gpus: int, estimated_start: float, elapsed_s: float) -> float:
    wait = fits.corrected_wait(gpus, estimated_start - now, elapsed_s)
    return estimated_start if wait is None else now + wait
