"""Holds: a QUEUED job held back from the scheduler (`corral hold`, `submit --hold`) and released
(`corral release`), as Slurm's `scontrol hold/release`.

- Who: the job's owner, an admin of its group, or an admin (the ones who may see it: anyone else
  gets get_job's 404, as for a missing job). An admin's hold (`held_as_admin`) is released only
  by an admin.
- What: the job stays QUEUED (submit time, priority, history kept); the schedule loop leaves it
  out of its input (server/snapshot.py), so it is never placed and counts in no one's queue
  position or estimated start. Its "why pending" is the hold (services.views.effective_diagnosis).
- Races: the columns are written by services/lifecycle.py (`hold`, `release`) by compare-and-set
  on (state = QUEUED, its hold): a hold racing the scheduler's placement either wins (the job
  stays queued, held) or loses (409 naming the state it was placed in).
- Repeats: holding a held job, or releasing one that is not, answers 200 with `changed` false and
  writes nothing. Each hold and release is a job event, and an audit entry (job.hold,
  job.release) when someone other than the owner does it.
"""

from __future__ import annotations

import time
from typing import TypedDict

from sqlalchemy.orm import Session

from corral.db.models import Job
from corral.services import audit, notify
from corral.services.audit_state import job_state
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden
from corral.services.jobs import get_job
from corral.services.lifecycle import JobState, hold, release
from corral.services.views import JobView, hold_event_text, hold_text, holder_name, is_held, job_view


class HoldOutcome(TypedDict):
    """What POST /jobs/{id}/hold and /release answer (the API's HoldOut)."""

    changed: bool  # false: it already was held (hold) or was not held (release)
    message: str
    job: JobView


def _refusal(job: Job) -> Conflict:
    """Why a job that is not queued cannot be held, naming its state."""
    if JobState(job.state).terminal:
        return Conflict(f"job {job.id} has already ended ({job.state}): only a queued job can be held")
    return Conflict(f"job {job.id} is {job.state}: only a queued job can be held; cancel it instead")


def _already(job: Job) -> HoldOutcome:
    return {"changed": False, "message": f"job {job.id} was already {hold_text(job)}", "job": job_view(job)}


def hold_job(session: Session, principal: Principal, job_id: int, *, now: float | None = None) -> HoldOutcome:
    """Hold a queued job (this module's docstring). Commits."""
    now = time.time() if now is None else now
    job = get_job(session, principal, job_id, for_update=True)
    if is_held(job):
        return _already(job)
    if job.state != JobState.QUEUED.value:
        raise _refusal(job)
    before = _hold_state(job)
    message = hold_event_text(principal.name, principal.is_admin)
    if not hold(
        session, job, user_id=principal.user_id, as_admin=principal.is_admin, now=now, message=message
    ):
        session.rollback()  # placed, ended or held since it was read: say which, as it is now
        session.refresh(job)
        if is_held(job):
            return _already(job)
        raise _refusal(job)
    _audit(session, principal, job, "job.hold", before)
    session.commit()
    return {"changed": True, "message": f"job {job.id} {hold_text(job)}", "job": job_view(job)}


def release_job(
    session: Session, principal: Principal, job_id: int, *, now: float | None = None
) -> HoldOutcome:
    """Release a held job: schedulable again at once (the schedule loop is woken). Commits."""
    now = time.time() if now is None else now
    job = get_job(session, principal, job_id, for_update=True)
    if not is_held(job):
        return {"changed": False, "message": f"job {job.id} is not held", "job": job_view(job)}
    if job.held_as_admin and not principal.is_admin:
        raise Forbidden(
            f"job {job.id} is held by {holder_name(job)} as an admin: only an admin can release it"
        )
    before = _hold_state(job)
    if not release(session, job, now=now, message=f"released by {principal.name}"):
        session.rollback()  # released (or cancelled) since it was read
        session.refresh(job)
        return {"changed": False, "message": f"job {job.id} is not held", "job": job_view(job)}
    notify.changed(session, notify.Topic.JOBS)  # as a submit does: the schedule loop looks now
    _audit(session, principal, job, "job.release", before)
    session.commit()
    return {"changed": True, "message": f"job {job.id} released: it is queued again", "job": job_view(job)}


def _hold_state(job: Job) -> dict[str, object]:
    return {**job_state(job), "held_by": job.held_by, "held_as_admin": bool(job.held_as_admin)}


def _audit(session: Session, principal: Principal, job: Job, action: str, before: dict[str, object]) -> None:
    """An audit entry when someone other than the job's owner held or released it."""
    if principal.user_id == job.user_id:
        return
    audit.record(
        session,
        actor=principal,
        action=action,
        target_kind="job",
        target_id=job.id,
        before=before,
        after=_hold_state(job),
    )
