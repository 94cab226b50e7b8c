"""Taking access away: removing a member from a group, deactivating (and reactivating) a user.

The rule for work still in flight, as Slurm's sacctmgr and OpenPAI have it: while the user has
live jobs (queued, scheduled, starting, running or preempted, with no cancel asked for yet) in
the group they leave, or anywhere when deactivated, the change is refused with 409 naming them
(a workspace's job by its workspace), unless the caller asks `cancel_jobs`: then each is
cancelled first through the jobs service's own cancel (the lifecycle's compare-and-set for a
queued job, a cancel request the control loops carry out for a placed one; audited job.cancel).

Sessions already open (exec and port-forward WebSockets, SSH gateway connections, workspace
proxy WebSockets) end through corral.services.open_sessions: every change here forgets the cached
principals, which wakes the servers' check of the sessions they hold.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from corral.db.base import lock_row
from corral.db.models import Group, Job, Membership, User, WebSession
from corral.db.workspace_models import Workspace
from corral.services.accounts import refuse_last_admin
from corral.services.auth import Principal, forget_principals
from corral.services.errors import Conflict, NotFound
from corral.services.jobs import cancel_job
from corral.services.lifecycle import TERMINAL_STATES

MOST_NAMED = 20  # jobs a refusal names; more are counted


def live_jobs(session: Session, user_id: int, group_id: int | None = None) -> list[tuple[int, str | None]]:
    """(job id, workspace name or None) of the user's jobs not ended and not being cancelled,
    in `group_id` only when given; oldest first."""
    stmt = (
        select(Job.id, Workspace.name)
        .outerjoin(Workspace, Workspace.current_job_id == Job.id)
        .where(Job.user_id == user_id, Job.state.not_in([s.value for s in TERMINAL_STATES]))
        .where(Job.cancel_requested.is_(False))
        .order_by(Job.id)
    )
    if group_id is not None:
        stmt = stmt.where(Job.group_id == group_id)
    return [(int(job_id), ws) for job_id, ws in session.execute(stmt).all()]


def _named(jobs: Sequence[tuple[int, str | None]]) -> str:
    names = [f"job {j}" if ws is None else f"job {j} (workspace {ws!r})" for j, ws in jobs[:MOST_NAMED]]
    more = len(jobs) - MOST_NAMED
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def _settle_jobs(
    session: Session, principal: Principal, jobs: Sequence[tuple[int, str | None]], what: str, cancel: bool
) -> bool:
    """Refuse `what` while `jobs` are live, or cancel them (each commits) when asked; returns
    whether it cancelled (committed) any."""
    if not jobs:
        return False
    if not cancel:
        raise Conflict(
            f"{what}: they have live jobs ({_named(jobs)}); cancel them first, or ask to cancel them "
            "(--cancel-jobs, cancel_jobs=true)"
        )
    for job_id, _ws in jobs:
        cancel_job(session, principal, job_id)
    return True


def remove_member(
    session: Session, principal: Principal, group: Group, user: User, *, cancel_jobs: bool = False
) -> str:
    """Take `user` out of `group` (the caller is an admin or the group's admin); returns the role
    they had. 404 when not a member, 409 for the group's last admin or while live jobs remain.
    Commits only the cancels; the removal is flushed for the caller to audit and commit."""
    what = f"user {user.name!r} cannot be removed from group {group.name!r}"
    # The user locked before the live-jobs check until the commit: a submission waits for it and
    # then finds no membership, or the check waits for the submission's job (submit_guard).
    _lock_user(session, user)
    membership = _membership(session, group, user)
    refuse_last_admin(session, group, membership, what)
    if _settle_jobs(session, principal, live_jobs(session, user.id, group.id), what, cancel_jobs):
        # Locked again: the cancels committed, and a job submitted meanwhile must refuse the removal.
        _lock_user(session, user)
        membership = _membership(session, group, user)
        refuse_last_admin(session, group, membership, what)  # (its lock went with the commit too)
        _settle_jobs(session, principal, live_jobs(session, user.id, group.id), what, False)
    role = membership.role
    session.delete(membership)
    if user.default_group_id == group.id:  # their jobs' default: another group of theirs, if any
        user.default_group_id = session.scalar(
            select(Membership.group_id)
            .where(Membership.user_id == user.id, Membership.group_id != group.id)
            .order_by(Membership.group_id)
            .limit(1)
        )
    session.flush()
    forget_principals(session)
    return role


def _membership(session: Session, group: Group, user: User) -> Membership:
    membership = session.get(Membership, (user.id, group.id), populate_existing=True)
    if membership is None:
        raise NotFound(f"user {user.name!r} is not a member of group {group.name!r}")
    return membership


def set_active(
    session: Session, principal: Principal, user: User, active: bool, *, cancel_jobs: bool = False
) -> None:
    """Deactivate (no login, no token, no SSH key; open sessions end) or reactivate `user`
    (admins). An admin cannot deactivate themself nor the last active admin (409). Portal
    sessions are deleted on deactivation: reactivating does not bring them back. Commits only
    the cancels; the change is flushed for the caller to audit and commit."""
    if not active:
        what = f"user {user.name!r} cannot be deactivated"
        if user.id == principal.user_id:
            raise Conflict(f"{what}: an administrator cannot deactivate themself")
        if user.is_admin and _active_admins(session) <= 1:
            raise Conflict(f"{what}: they are the last active administrator")
        # Locked before the live-jobs check until the commit: a submission waits for it and then
        # reads the user inactive, or the check waits for the submission's job (submit_guard).
        _lock_user(session, user)
        if _settle_jobs(session, principal, live_jobs(session, user.id), what, cancel_jobs):
            # Locked again: the cancels committed, and a job submitted meanwhile must refuse it.
            _lock_user(session, user)
            _settle_jobs(session, principal, live_jobs(session, user.id), what, False)
        session.execute(delete(WebSession).where(WebSession.user_id == user.id))
    user.active = active
    session.flush()
    forget_principals(session)


def _lock_user(session: Session, user: User) -> None:
    """Lock the user's row until the transaction ends, read again as committed by then: what a
    submission's corral.services.submit_guard waits for."""
    if not lock_row(session, user):
        raise NotFound(f"no user named {user.name!r}")


def _active_admins(session: Session) -> int:
    stmt = select(func.count()).select_from(User).where(User.is_admin.is_(True), User.active.is_(True))
    return int(session.scalar(stmt) or 0)
