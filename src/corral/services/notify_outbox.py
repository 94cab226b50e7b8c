"""The job notification outbox's write (corral.services.job_notify): which moves of a job are
events a spec's `notify` may ask for, and the INSERT of their rows. Called by
corral.services.lifecycle only, in the transaction of the compare-and-set that moved the jobs, so
a crash loses no notification and a lost race writes none."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import insert
from sqlalchemy.orm import Session

from corral.db.base import table_of
from corral.db.models import Job
from corral.db.notify_models import JobNotification
from corral.services.states import JobState

INSERT_NOTIFICATION = insert(table_of(JobNotification))
# The job events a spec's `notify` may ask for (corral.spec.NOTIFY_EVENTS), by the state entered;
# QUEUED is "requeued" only from work that was under way (not a placement that fell through).
NOTIFY_EVENT_OF = {
    JobState.RUNNING: "started",
    JobState.SUCCEEDED: "succeeded",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
}
REQUEUED_FROM = frozenset({JobState.STARTING, JobState.RUNNING, JobState.PREEMPTED})


def notify_event(current: JobState, target: JobState) -> str | None:
    """The notification event of a move from `current` to `target`; None: not one."""
    if target is JobState.QUEUED:
        return "requeued" if current in REQUEUED_FROM else None
    return NOTIFY_EVENT_OF.get(target)


def queue_notifications(
    session: Session, jobs: Sequence[Job], current: JobState, target: JobState, *, now: float,
    messages: Mapping[int, str],
) -> None:  # fmt: skip
    """The outbox rows of `jobs` that just moved from `current` to `target` (their compare-and-set
    won, in this transaction) and whose spec's `notify` asks for the move's event: one INSERT,
    sent by the notification loop after the commit (corral.services.job_notify). Nothing else
    is read or sent here: the transition stays as quick as it was."""
    event = notify_event(current, target)
    if event is None:
        return
    rows = [
        {
            "job_id": job.id, "user_id": job.user_id, "event": event, "attempt": job.attempt_count,
            "at": now, "message": messages.get(job.id, ""), "state": "pending", "digest_id": None,
        }
        for job in jobs
        if job.spec.notify is not None and event in job.spec.notify.on
    ]  # fmt: skip
    if rows:
        session.connection().execute(INSERT_NOTIFICATION, rows)
