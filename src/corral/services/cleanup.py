"""Deleting finished jobs and their logs: by the job's owner or an administrator (`DELETE
/api/v1/jobs/{id}`, `corral rm`), and by the retention loop (`CORRAL_JOB_RETENTION_DAYS`).

Order matters for "a crash loses nothing and leaves nothing behind": the engine's copy of each
attempt (its logs) is removed first, then the job's rows (job, attempts, events; monitoring's
rows go by foreign-key cascade) in one transaction. A crash in between leaves the job listed with
its logs gone, and deleting it again finishes the work (engine removal is idempotent).

What registered models need is kept: a model version (corral.catalog) owns a read-only copy of
its files under `<storage root>/model/`, made when it is registered, and its lineage is stored as
values, not as references to the job. So deleting a job or its outputs (here, by a user or by
retention) never removes a model's files or lineage, and no job has to stay for a model.
`kept_by_registry` is the one place that says which jobs must stay (deletion refuses them with
409, retention skips them): today an environment build job until its version is settled.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, selectinload

from corral.db.environment_models import Environment, EnvironmentVersion
from corral.db.models import Attempt, Job, JobEvent
from corral.engine.base import Engine
from corral.environments.service import BUILDING
from corral.services import audit
from corral.services.audit_state import job_state
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden
from corral.services.jobs import EngineMissing, get_job
from corral.services.lifecycle import JobState
from corral.storage.layout import remove_job_logs, remove_outputs

log = logging.getLogger("corral.services.cleanup")
TERMINAL_STATES = tuple(s.value for s in JobState if s.terminal)
RETENTION_BATCH = 200  # jobs deleted per retention pass; a longer backlog goes on next pass


def kept_by_registry(session: Session, job_ids: Sequence[int]) -> dict[int, str]:
    """{job id: why it must be kept} for jobs something registered depends on. Model versions
    own copies of their files (corral.catalog.model_files), so none depends on its job. An
    environment version still `building` does until the env-builds loop has settled it: the loop
    reads its build job's outputs (lock, venv), and a job deleted first left the version waiting
    to fail as orphaned, or, with the id given again (SQLite gives the highest one again), read
    another job's outputs as its build."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(EnvironmentVersion.build_job_id, Environment.name, EnvironmentVersion.version)
        .join(Environment, Environment.id == EnvironmentVersion.environment_id)
        .where(EnvironmentVersion.build_job_id.in_(list(job_ids)), EnvironmentVersion.state == BUILDING)
    )
    return {
        job_id: f"it builds environment {name}@{version}, not settled yet; delete it once "
        f"`corral env show {name}@{version}` says ready or failed"
        for job_id, name, version in rows
        if job_id is not None
    }


def delete_job(
    session: Session,
    principal: Principal,
    job_id: int,
    engine: Engine | None,
    storage_root: Path | None = None,
) -> None:
    """Delete one finished job and its logs. 404: no such job; 403: not visible, or visible
    (a group admin) but neither owned nor admin; 409: not finished, or kept for a model. Commits."""
    job = get_job(session, principal, job_id, for_update=True)
    if not principal.is_admin and job.user_id != principal.user_id:
        raise Forbidden(f"only the owner of job {job_id} or an administrator may delete it")
    state = JobState(job.state)
    if not state.terminal:
        raise Conflict(
            f"job {job_id} is {state.value}; only finished jobs can be deleted. Cancel it first "
            f"(`corral cancel {job_id}`) and delete it once it has ended"
        )
    kept = kept_by_registry(session, [job.id])
    if job.id in kept:
        raise Conflict(f"job {job_id} is kept: {kept[job.id]}")
    before = job_state(job)
    remove_job(session, job, engine, storage_root)
    audit.record(
        session, actor=principal, action="job.delete", target_kind="job", target_id=job_id, before=before
    )
    session.commit()


def remove_job(session: Session, job: Job, engine: Engine | None, storage_root: Path | None = None) -> None:
    """The engine's copy of every attempt, the job's outputs dir and its log links (corral.storage),
    then the rows (not committed here)."""
    if job.attempts:
        if engine is None:
            raise EngineMissing(
                f"job {job.id}'s logs cannot be deleted: this server has no execution engine running"
            )
        for attempt in job.attempts:
            engine.remove_attempt(attempt.attempt_id)
    if storage_root is not None:
        remove_outputs(storage_root, job.id)
        remove_job_logs(storage_root, job.user.name, job.id)
    session.execute(delete(JobEvent).where(JobEvent.job_id == job.id))
    session.execute(delete(Attempt).where(Attempt.job_id == job.id))
    session.execute(delete(Job).where(Job.id == job.id))
    session.expunge(job)


def expired_job_ids(session: Session, cutoff: float, limit: int = RETENTION_BATCH) -> list[int]:
    """Finished jobs that ended before `cutoff` (unix seconds), oldest ids first."""
    ended = func.coalesce(Job.finished_at, Job.updated_at)
    stmt = select(Job.id).where(Job.state.in_(TERMINAL_STATES), ended < cutoff).order_by(Job.id).limit(limit)
    return list(session.scalars(stmt))


def delete_expired_jobs(
    session: Session,
    engine: Engine,
    now: float,
    retention_s: float,
    limit: int = RETENTION_BATCH,
    storage_root: Path | None = None,
) -> list[int]:
    """One retention pass: delete up to `limit` jobs that finished more than `retention_s` ago,
    each in its own transaction (one that fails is logged and left for the next pass). Returns
    the ids deleted."""
    ids = expired_job_ids(session, now - retention_s, limit)
    kept = kept_by_registry(session, ids)
    deleted = []
    for job_id in ids:
        if job_id in kept:
            continue
        try:
            job = session.scalars(
                select(Job).where(Job.id == job_id).options(selectinload(Job.attempts))
            ).first()
            if job is not None and job.state in TERMINAL_STATES:
                remove_job(session, job, engine, storage_root)
                session.commit()
                deleted.append(job_id)
        except Exception:
            session.rollback()
            log.exception("retention: could not delete job %s; trying again next pass", job_id)
    return deleted
