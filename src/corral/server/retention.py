"""The retention loop: deletes finished jobs and their logs once they are older than
`CORRAL_JOB_RETENTION_DAYS` (unset: keep everything), and admin audit records older than
`CORRAL_AUDIT_RETENTION_DAYS` (365; unset: keep everything), and expired portal sessions (with
their workspace cookies). A leased singleton, like the other
loops, so two servers never delete the same job twice; it looks for expired rows every
`CORRAL_JOB_RETENTION_CHECK_S` (300 s), sooner while a job backlog remains. The deletions
themselves are `corral.services.cleanup` (the same as `DELETE /api/v1/jobs/{id}`) and
`corral.services.audit.purge_before` (the only path the database lets delete audit rows)."""

from __future__ import annotations

import logging

from corral.server.context import ServerContext
from corral.services.audit import purge_before
from corral.services.auth import delete_expired_sessions
from corral.services.cleanup import RETENTION_BATCH, delete_expired_jobs
from corral.words import plural

log = logging.getLogger("corral.server.retention")
RETENTION_LOOP_INTERVAL_S = 5.0


def retention_tick(ctx: ServerContext, now: float) -> None:
    purge_audit_log(ctx, now)
    purge_expired_sessions(ctx, now)
    expire_jobs(ctx, now)


def purge_expired_sessions(ctx: ServerContext, now: float) -> None:
    """Portal sessions past their expiry: refused already, but their rows (and their workspace
    cookies', one per session and workspace) stayed forever."""
    if now - ctx.memory.sessions_purged_at < ctx.settings.job_retention_check_s:
        return
    with ctx.session_factory() as session:
        deleted = delete_expired_sessions(session, now)
    ctx.memory.sessions_purged_at = now
    if deleted:
        log.info("retention: deleted %s past their expiry", plural(deleted, "portal session"))


def purge_audit_log(ctx: ServerContext, now: float) -> None:
    days = ctx.settings.audit_retention_days
    if days is None or now - ctx.memory.audit_purged_at < ctx.settings.job_retention_check_s:
        return
    with ctx.session_factory() as session:
        deleted = purge_before(session, now - days * 86400.0)
    ctx.memory.audit_purged_at = now
    if deleted:
        log.info("retention: deleted %s written over %g days ago", plural(deleted, "audit record"), days)


def expire_jobs(ctx: ServerContext, now: float) -> None:
    days = ctx.settings.job_retention_days
    if days is None:
        return
    if now - ctx.memory.retention_checked_at < ctx.settings.job_retention_check_s:
        return
    with ctx.session_factory() as session:
        deleted = delete_expired_jobs(
            session, ctx.engine, now, days * 86400.0, storage_root=ctx.settings.storage_path
        )
    if len(deleted) < RETENTION_BATCH:  # a full batch: more may be waiting, look again next tick
        ctx.memory.retention_checked_at = now
    if deleted:
        log.info(
            "retention: deleted %s finished over %g days ago: %s", plural(len(deleted), "job"), days, deleted
        )
