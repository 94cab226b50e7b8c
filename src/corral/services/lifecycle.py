"""Job states and the one guarded `transition()` every state change goes through.

    QUEUED -> SCHEDULED -> STARTING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
    RUNNING -> PREEMPTED -> QUEUED;  a failed attempt with retries left -> QUEUED (new attempt)
    any non-terminal state -> CANCELLED;  terminal states are final.

Guards live here and nowhere else (Prefect's orchestration-rules idea): callers say what they want,
`transition` checks it is allowed, stamps times, records a JobEvent and returns. Retry is one rule:
FAILED with retries left becomes QUEUED instead; only failed or lost attempts use up retries.
"""

from __future__ import annotations

from enum import StrEnum
from typing import cast

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from corral.db.models import Attempt, Job, JobEvent


class JobState(StrEnum):
    QUEUED = "queued"
    SCHEDULED = "scheduled"
    STARTING = "starting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def active(self) -> bool:
        """Holds (or is about to hold) resources."""
        return self in (JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING, JobState.PREEMPTED)


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class AttemptState(StrEnum):
    SCHEDULED = "scheduled"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    LOST = "lost"

    @property
    def finished(self) -> bool:
        return self not in (AttemptState.SCHEDULED, AttemptState.STARTING, AttemptState.RUNNING)


_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.SCHEDULED, JobState.CANCELLED, JobState.FAILED}),
    JobState.SCHEDULED: frozenset({JobState.STARTING, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.QUEUED}
    ),
    JobState.PREEMPTED: frozenset({JobState.QUEUED, JobState.CANCELLED, JobState.FAILED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class InvalidTransition(ValueError):
    def __init__(self, job_id: int, current: JobState, target: JobState) -> None:
        super().__init__(f"job {job_id} cannot go from {current.value} to {target.value}")
        self.job_id = job_id
        self.current = current
        self.target = target


def can_transition(current: JobState, target: JobState) -> bool:
    return target in _ALLOWED[current]


def transition(session: Session, job: Job, target: JobState, *, now: float, message: str = "") -> JobState:
    """Move `job` to `target` (or to QUEUED when `target` is FAILED and retries are left).

    Returns the state actually entered. Raises InvalidTransition when the guard refuses; the
    caller's transaction is then rolled back by the caller, so nothing is half-written.
    Cancelled jobs are never retried.
    """
    current = JobState(job.state)
    if target is JobState.FAILED and not job.cancel_requested:
        failures = _failed_attempts(session, job)
        if failures <= job.max_retries:
            target = JobState.QUEUED
            message = f"{message} (retrying: retry {failures} of {job.max_retries})".strip()
    if not can_transition(current, target):
        raise InvalidTransition(job.id, current, target)
    job.state = target.value
    job.updated_at = now
    if target.terminal:
        job.finished_at = now
        if message:
            job.reason = message
    if target.terminal:
        job.diagnosis = None
    record_event(session, job.id, now, message, from_state=current.value, to_state=target.value)
    return target


INSERT_EVENT = insert(cast(Table, JobEvent.__table__))


def record_event(
    session: Session,
    job_id: int,
    now: float,
    message: str,
    *,
    kind: str = "transition",
    from_state: str | None = None,
    to_state: str | None = None,
    immediate: bool = False,
) -> None:
    """Add one entry to the job's event history (shown by `corral show`, the API and the portal),
    written at the session's next flush, with the job's own changes.

    `immediate`: one INSERT executed now instead, for a job row already written. Only for short
    write transactions (submit): on SQLite it takes the write lock at once, and the control loops,
    which call the engine before they commit, must not hold it that long."""
    columns = {
        "job_id": job_id,
        "at": now,
        "kind": kind,
        "from_state": from_state,
        "to_state": to_state,
        "message": message,
    }
    if immediate:
        session.connection().execute(INSERT_EVENT, columns)
    else:
        session.add(JobEvent(**columns))


def _failed_attempts(session: Session, job: Job) -> int:
    """Attempts that failed or were lost, the current one included (callers end the attempt
    before they transition the job). Preempted attempts do not use up retries.

    Counted on the loaded objects, not with COUNT(*): loops run with autoflush off, and objects
    already in the session keep their unflushed state when a query returns them."""
    failed = (AttemptState.FAILED.value, AttemptState.LOST.value)
    attempts = session.scalars(select(Attempt).where(Attempt.job_id == job.id))
    return sum(1 for attempt in attempts if attempt.state in failed)
