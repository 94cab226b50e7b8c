"""The live side of the estimated-start calibration (corral.scheduler.eta_calibration, the same
code the simulator uses): the schedule loop records the first wait its roll predicted for a job
that was never placed (`jobs.eta_shown_at`, `jobs.eta_shown_wait_s`, migration 0032), and once
the job's first attempt has started (`Attempt.started_at`: when the engine started it, which the
reconcile loop records; what the user sees, and in the simulator a placement is a start),
(predicted, actual) is one outcome. The placement is not: on Slurm a placed job may wait in the
engine's queue, and any launch takes a while. A first attempt that never started (its launch
failed, the job was cancelled or preempted before the engine ran it) is no outcome. A hold
forgets the shown estimate (lifecycle.hold: the job is measured from its first estimate after the
release). A job placed ahead of a freed slot (Slurm, server/ahead.py) is an outcome like any
other: it starts, and is measured, when the job before it ends. The estimates the loop writes to
`Job.diagnosis` (what `GET /jobs/{id}`, `corral why` and the job page show) are the roll's with
their waits from now corrected by those outcomes: the first in full, each later one less as the job waits
(eta_calibration.faded, from when this server first showed it one: `LoopMemory.eta_since`). A job
whose size class and cluster have too few outcomes (eta_calibration.MIN_OUTCOMES) gets the roll's
estimate unchanged.

The calibration lives in the loop's memory (`LoopMemory.eta_calibration`). Each time the loop is
about to show estimates it reads the outcomes of the jobs started since it last did
(`note_started`: an index range on attempts (number, started_at), migration 0034, from a little
before the latest start it saw, LATE_START_S, since a start is committed a poll after it
happened), whichever server's reconcile loop recorded them. A restarted server, the first tick,
or a server that gets the schedule lease back (runner.py: another server scheduled meanwhile)
rebuilds it from the outcomes in the database: the last LOADED_OUTCOMES of the last
LOADED_SPAN_S, the same pairs the live path records. A long-running server may still hold older
outcomes of a rare size class than a rebuilt one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from sqlalchemy import Row, Select, bindparam, func, select, update
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
# ... started in the last 30 days at most: the read stays an index range (attempts (number,
# started_at), migration 0034) on a database of millions of attempts, and a wait measured under a
# month-old queue says little about today's.
LOADED_SPAN_S = 30 * 86400.0


# An attempt's start (the engine's time, or the reconcile tick's) is committed a poll or so after
# it: each read of new outcomes looks this far back before the latest start it saw, and skips the
# ones it recorded. One committed later than that is left to the next rebuild.
LATE_START_S = 300.0


@dataclass(slots=True)
class OutcomesRead:
    """How far the loop's calibration has read the outcomes (`LoopMemory.eta_read`): the latest
    first-attempt start there was at the last read, and the jobs recorded since LATE_START_S before
    it (read again by the next look back, not recorded twice)."""

    latest: float | None
    recorded: dict[int, float]  # job id -> its first attempt's start
    # first attempts started in the window (from LATE_START_S before `latest`) at the last read:
    # the window's count and latest start unchanged = nothing new to read (a start committed late
    # into the window raises the count; none leaves it)
    in_window: int | None = None

    def forget_before(self, latest: float | None) -> None:
        self.latest = latest
        if latest is not None:
            self.recorded = {j: at for j, at in self.recorded.items() if at >= latest - LATE_START_S}


# job id, GPUs, shown at, shown wait, started at (the last three never NULL: _outcomes_started)
_Outcome = Row[int, int | None, float, float, float]


def _outcomes_started(since: float) -> Select[int, int | None, float, float, float]:
    """(job id, GPUs, shown at, shown wait, started at) of the jobs whose first attempt started at
    or after `since` after they were shown an estimate: an index range on attempts (number,
    started_at) (migration 0034). A first attempt that never started (failed at launch, cancelled
    or preempted before the engine ran it) has no start: no outcome."""
    first = (
        select(Attempt.job_id, Attempt.started_at)
        .where(Attempt.number == 1, Attempt.started_at >= since)
        .subquery()
    )
    outcomes = (
        select(Job.id, Job.gpus, Job.eta_shown_at, Job.eta_shown_wait_s, first.c.started_at)
        .join(first, first.c.job_id == Job.id)
        .where(
            Job.eta_shown_at.is_not(None),
            Job.eta_shown_wait_s.is_not(None),
            # shown before its first start (note_shown records none after the first placement;
            # rows written before it checked that are left out here)
            first.c.started_at >= Job.eta_shown_at,
        )
        .order_by(first.c.started_at.desc())
    )
    return cast("Select[int, int | None, float, float, float]", outcomes)  # (the WHERE: no NULLs)


# The latest start of a first attempt (the last entry of the same index): where the next read of
# new outcomes begins, LATE_START_S before it
LATEST_FIRST_START = select(func.max(Attempt.started_at)).where(Attempt.number == 1)


def _window(since: float) -> Select[float | None, int]:
    """(latest start, count) of the first attempts started at or after `since`: the covering
    index (number, started_at) alone, no join."""
    return select(func.max(Attempt.started_at), func.count()).where(
        Attempt.number == 1, Attempt.started_at >= since
    )


def load_outcomes(
    session: Session, calibration: EtaCalibration, now: float, limit: int = LOADED_OUTCOMES
) -> int:
    """Record into `calibration` the last `limit` jobs whose first attempt started after they
    were shown an estimate (in the LOADED_SPAN_S before `now`), oldest first (the order they
    happened in); how many."""
    return len(_load(session, calibration, now, limit))


def _load(session: Session, calibration: EtaCalibration, now: float, limit: int) -> Sequence[_Outcome]:
    return _record(calibration, session.execute(_outcomes_started(now - LOADED_SPAN_S).limit(limit)).all())


def _record(calibration: EtaCalibration, rows: Sequence[_Outcome]) -> Sequence[_Outcome]:
    """Record `rows` (newest first, as _outcomes_started sorts them) oldest first; returns them."""
    for _, gpus, shown_at, wait_s, started_at in reversed(rows):
        calibration.record(gpus or 0, wait_s, started_at - shown_at)
    return rows


def calibration_of(ctx: ServerContext, session: Session, now: float) -> EtaCalibration:
    """The loop's calibration with every outcome recorded so far: rebuilt from the database the
    first time it is asked for, else brought up to date with the jobs that started since it last
    was (`note_started`)."""
    memory = ctx.memory
    found = memory.eta_calibration
    if found is None:
        found = memory.eta_calibration = EtaCalibration()
        latest = session.scalar(LATEST_FIRST_START)
        counted = _counted_from(session, latest)
        rows = _load(session, found, now, LOADED_OUTCOMES)
        memory.eta_read = OutcomesRead(latest, {row[0]: row[4] for row in rows}, counted)
        memory.eta_read.forget_before(latest)
        return found
    note_started(ctx, session, now)
    return found


def note_started(ctx: ServerContext, session: Session, now: float) -> None:
    """Record in the loop's calibration the outcomes of the jobs whose first attempt started
    since the last read: when the engine started it (`Attempt.started_at`, set by the reconcile
    loop), which is when the user sees the job start, not its placement (on Slurm a job may wait
    in the engine's queue after it). Each read is an index range: the first attempts started
    from LATE_START_S before the latest start the last read saw. (A calibration set without a
    read, as a test does, reads the outcomes of the LOADED_SPAN_S before `now` first.)"""
    memory = ctx.memory
    calibration = memory.eta_calibration
    if calibration is None:
        return
    read = memory.eta_read
    if read is None:
        read = memory.eta_read = OutcomesRead(None, {})
    if read.latest is None:
        latest = session.scalar(LATEST_FIRST_START)
        if latest is None:  # no job has started yet
            return
        since, counted = now - LOADED_SPAN_S, _counted_from(session, latest)
    else:
        since = read.latest - LATE_START_S
        latest, count = session.execute(_window(since)).one()
        if latest == read.latest and count == read.in_window:
            return  # the join below re-read every start of the window (~25 ms with 2,000 there)
        # the next look's window starts LATE_START_S before `latest`: unmoved, that is this one
        counted = int(count) if latest == read.latest else _counted_from(session, latest)
    # (each count is taken before the read below: a start committed after it is read next time)
    recorded = read.recorded
    new = [row for row in session.execute(_outcomes_started(since)).all() if row[0] not in recorded]
    for row in _record(calibration, new):
        recorded[row[0]] = row[4]
    read.forget_before(latest)
    read.in_window = counted


def _counted_from(session: Session, latest: float | None) -> int | None:
    """The count of the window the next look reads (from LATE_START_S before `latest`)."""
    return None if latest is None else int(session.execute(_window(latest - LATE_START_S)).one()[1])


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
