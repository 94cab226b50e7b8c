"""A submission holds the access it was given until it commits (docs/security.md).

A member's removal and a user's deactivation (corral.services.offboard) refuse while the user
has live jobs, so a job submitted between their check and their commit would outlive them. Both
lock the user's row (`lock_row`, an UPDATE) before they look for live jobs and hold it until they
commit. `hold_access`, run by the submit after it INSERTed the job, reads that row `FOR SHARE`
on PostgreSQL: behind a change that locked first it waits, then reads the user inactive, or (its
next statement, a fresh snapshot) the membership gone, and refuses; a change that locks later
waits for the submit's commit, and its live-jobs check then sees the job (409 naming it). The
membership is read by a second statement, not joined and locked with the user: a join's locks
are taken in the plan's order, and the removal (membership, then the user's default group)
deadlocked with it. On SQLite the job's INSERT began the submit's write transaction, so its
reads see every commit before it and none can come between them and the submit's commit (one
writer at a time); the change's lock is a write too, so nothing commits between its check and
its own commit either."""

from __future__ import annotations

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from corral.db.models import Membership, User
from corral.services.auth import Principal
from corral.services.errors import Forbidden

# Built once (the submit is the hottest write path). FOR SHARE on PostgreSQL, nothing on SQLite;
# the membership is read after the lock, so in a snapshot taken after any change it waited for.
USER_ACCESS = select(User.active).where(User.id == bindparam("user_id")).with_for_update(read=True)
MEMBER_ACCESS = select(Membership.role).where(
    Membership.user_id == bindparam("user_id"), Membership.group_id == bindparam("group_id")
)


def hold_access(session: Session, principal: Principal, group_id: int, group_name: str) -> None:
    """Refuse (403) the submission being written when its user was deactivated, or (a non-admin)
    removed from the group, since their credentials were read; otherwise keep the rows read from
    changing until the submission's transaction ends. Call after the job's INSERT."""
    params = {"user_id": principal.user_id, "group_id": group_id}
    if not session.execute(USER_ACCESS, params).scalar():  # after any change that locked it first
        raise Forbidden(f"user {principal.name!r} is deactivated, so no job is submitted")
    if not principal.is_admin and session.execute(MEMBER_ACCESS, params).scalar() is None:
        raise Forbidden(
            f"you are no longer a member of group {group_name!r}, so you cannot submit jobs to it"
        )
