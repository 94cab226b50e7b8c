"""Sets of jobs picked by label or id, for tools that run many jobs at once (an AutoML search's
trials, a sweep): reading the `label` and `id` filters of GET /jobs, cancelling every visible
live job that carries some labels (POST /jobs/cancel, `corral cancel -l experiment=e1`), and
holding or releasing every visible queued one (POST /jobs/hold, /jobs/release, `corral hold -l`).

A bulk cancel is one `services.jobs.cancel_job` per job, each in its own transaction through the
lifecycle's compare-and-set (a queued job ends at once, a running one is asked to stop): a job that
ended or was deleted meanwhile is reported as such and the others go on. A bulk hold or release is
likewise one `services.holds.hold_job` / `release_job` per queued job (their rights, audit and
repeat rules), a refusal (placed meanwhile; an admin's hold released by a non-admin) said for that
job alone. Nothing is done for jobs the caller may not see, as for a single cancel or hold.

Whose jobs a bulk action by label reaches is said explicitly (`scope_condition`): by default only
the caller's own, as `scancel --name` for a user. Labels are free text each user picks, so two
users' experiments may share `experiment=e1`; a group admin's or an admin's cancel must not reach
a member's trials unless they ask for them (`user=NAME`, or `all_users`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, TypedDict

from sqlalchemy import ColumnElement, and_, exists, or_, select
from sqlalchemy.orm import Session

from corral.db.models import Job, Membership, User
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.services.holds import HoldOutcome, hold_job, release_job
from corral.services.jobs import MAX_IDS, JobFilter, cancel_job, matching_ids
from corral.services.lifecycle import JobState
from corral.services.views import is_held
from corral.spec import MAX_LABELS, parse_label_selector

MAX_JOB_ID = 2**31 - 1  # jobs.id is a 32-bit integer on PostgreSQL (corral.api.deps.MAX_ROW_ID)
LIVE_STATES = tuple(s.value for s in JobState if not s.terminal)

# The most jobs one bulk action acts on; `more` in its answer says some were left (run it again).
MAX_BULK_JOBS = 1000

CancelOutcome = Literal["cancelled", "stopping", "ended", "gone"]
HoldSetOutcome = Literal["held", "released", "unchanged", "refused", "gone"]


class CancelledByLabels(TypedDict):
    matched: int  # jobs acted on (at most MAX_BULK_JOBS)
    more: bool  # more jobs matched than one request acts on: run it again for the rest
    items: list[CancelledJob]


class HeldByLabels(TypedDict):
    matched: int  # jobs acted on (at most MAX_BULK_JOBS)
    more: bool  # more jobs matched than one request acts on: run it again for the rest
    items: list[HeldJob]


class CancelledJob(TypedDict):
    """What a bulk cancel did to one job."""

    id: int
    outcome: CancelOutcome  # cancelled (was queued) | stopping | ended (before) | gone (deleted)
    state: str | None  # the job's state after it (None: deleted)
    message: str


class HeldJob(TypedDict):
    """What a bulk hold or release did to one job."""

    id: int
    # held / released | unchanged (already held; not held) | refused (placed meanwhile; an admin's
    # hold, for a non-admin) | gone (deleted meanwhile)
    outcome: HoldSetOutcome
    state: str | None  # the job's state after it (None: deleted)
    held: bool | None  # whether it is held now (None: deleted)
    message: str


def label_selectors(values: Iterable[str], loc: tuple[str | int, ...]) -> tuple[tuple[str, str | None], ...]:
    """`["experiment=e1", "trial"]` -> (("experiment", "e1"), ("trial", None)); every bad one
    named at once at `loc`."""
    parsed: list[tuple[str, str | None]] = []
    wrong: list[tuple[tuple[str | int, ...], str]] = []
    for value in values:
        try:
            parsed.append(parse_label_selector(value))
        except ValueError as exc:
            wrong.append((loc, str(exc)))
    if wrong:
        raise Invalid.each(wrong)
    if len(parsed) > MAX_LABELS:
        raise Invalid(f"{len(parsed)} labels given; a job has at most {MAX_LABELS}", loc)
    return tuple(parsed)


def job_ids(values: Sequence[str] | None) -> tuple[int, ...] | None:
    """`["3,4", "7"]` -> (3, 4, 7): GET /jobs?id=, repeated or comma-separated; None: no `id`
    given (no filter). An id no job can have (0, or past MAX_ROW_ID) is left out: it matches
    nothing, as a deleted job's id does (and the database's integer column cannot compare it)."""
    if values is None:
        return None
    ids: list[int] = []
    count = 0
    for value in values:
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            if not item.isascii() or not item.isdigit() or len(item) > 10:
                raise Invalid(f"{item!r} is not a job id (a whole number)", ("query", "id"))
            count += 1
            if 1 <= int(item) <= MAX_JOB_ID:
                ids.append(int(item))
    if count > MAX_IDS:
        raise Invalid(f"{count} job ids given; at most {MAX_IDS} at once", ("query", "id"))
    return tuple(dict.fromkeys(ids))


def scope_condition(
    session: Session, principal: Principal, user: str | None = None, all_users: bool = False
) -> ColumnElement[bool] | None:
    """Whose jobs a bulk action by label acts on, as an SQL condition (None: anyone's). By
    default the caller's own; `user=NAME` that user's (admins: anyone's; group admins: within the
    groups they administer; the caller's own name: their own); `all_users` every job the caller
    may act on (admins: all; group admins: theirs and their groups'). One rule with a single
    job's cancel, hold and release: a group admin acts on every job in the groups they
    administer, whoever's, a former member's included, so `user=NAME` names a member of those
    groups or the owner of a job in them. Others than admins and group admins are refused (403)
    naming why; any other `user` is refused by a group admin with the same words whether or not
    that name exists (no user enumeration)."""
    if user is not None and all_users:
        raise Invalid("give user or all_users, not both", ("body", "user"))
    own = Job.user_id == principal.user_id
    if (user is None and not all_users) or user == principal.name:
        return own
    admin_groups = sorted(principal.admin_group_ids)
    if not principal.is_admin and not admin_groups:
        raise Forbidden("only admins and group admins act on other users' jobs; leave out user/all_users")
    if all_users:
        return None if principal.is_admin else or_(own, Job.group_id.in_(admin_groups))
    uid = session.scalar(select(User.id).where(User.name == user))
    if principal.is_admin:
        if uid is None:
            raise Invalid(f"no user named {user!r}", ("body", "user"))
        return Job.user_id == uid
    if uid is None or not _within_groups(session, uid, admin_groups):
        raise Forbidden(f"no user named {user!r} is a member of, or has jobs in, a group you administer")
    return and_(Job.user_id == uid, Job.group_id.in_(admin_groups))


def _within_groups(session: Session, user_id: int, group_ids: Sequence[int]) -> bool:
    """Whether a group admin may name this user: a member of one of `group_ids`, or the owner of a
    job in one (a former member's: the group admin sees and may cancel, hold or release each of
    those jobs one at a time, services.jobs.visibility, so naming them tells nothing new)."""
    member = select(Membership.user_id).where(
        Membership.user_id == user_id, Membership.group_id.in_(group_ids)
    )
    owner = select(Job.id).where(Job.user_id == user_id, Job.group_id.in_(group_ids))
    return session.scalar(select(exists(member) | exists(owner))) is True


def cancel_by_labels(
    session: Session,
    principal: Principal,
    labels: Sequence[tuple[str, str | None]],
    *,
    scope: ColumnElement[bool] | None,
    now: float | None = None,
    reason: str | None = None,
) -> CancelledByLabels:
    """Cancel every live job the caller may see, within `scope` (`scope_condition`: whose), that
    carries all of `labels`, those not yet asked to stop first (`_pick`), at most MAX_BULK_JOBS
    (`more`: run it again), one transaction per job; what happened to each (`reason`: as for one
    cancel). At least one label: an empty selector would cancel everything the caller can see."""
    if not labels:
        raise Invalid("name at least one label (NAME=VALUE) whose jobs to cancel", ("body", "labels"))
    now = time.time() if now is None else now
    flt = JobFilter(state=LIVE_STATES, labels=labels)
    ids, more = _pick(session, principal, flt, scope, Job.cancel_requested.is_(False))
    items = [_cancel_one(session, principal, job_id, now, reason) for job_id in ids]
    return {"matched": len(items), "more": more, "items": items}


def _pick(
    session: Session,
    principal: Principal,
    flt: JobFilter,
    scope: ColumnElement[bool] | None,
    pending: ColumnElement[bool],
) -> tuple[list[int], bool]:
    """At most MAX_BULK_JOBS of the matching jobs, those the action would still change
    (`pending`: not yet asked to stop, not held, held) first, oldest first within each, and
    whether one it would change is left over (`more`). Jobs it would not change go last, so each
    repeated call gets further: oldest first alone picked the same 1000 stopping or held jobs
    again and again, and job 1001 was never reached (review108 #2). The session's transaction
    ends here: each action below is a transaction of its own."""
    ids = matching_ids(session, principal, flt, scope=scope, limit=MAX_BULK_JOBS + 1, first=pending)
    more = len(ids) > MAX_BULK_JOBS and bool(
        session.scalar(select(Job.id).where(Job.id == ids[MAX_BULK_JOBS], pending))
    )
    session.rollback()
    return ids[:MAX_BULK_JOBS], more


def _cancel_one(
    session: Session, principal: Principal, job_id: int, now: float, reason: str | None
) -> CancelledJob:
    try:
        job = cancel_job(session, principal, job_id, now=now, reason=reason)
    except Conflict as exc:  # it ended between the listing and its cancel
        session.rollback()
        state = session.scalar(select(Job.state).where(Job.id == job_id))
        return {"id": job_id, "outcome": "ended", "state": state, "message": exc.message}
    except NotFound:  # deleted meanwhile
        session.rollback()
        return {"id": job_id, "outcome": "gone", "state": None, "message": f"job {job_id} is gone"}
    if job.state == JobState.CANCELLED.value:
        message = f"job {job_id} cancelled"
        return {"id": job_id, "outcome": "cancelled", "state": job.state, "message": message}
    return {
        "id": job_id,
        "outcome": "stopping",
        "state": job.state,
        "message": f"job {job_id} is {job.state}; it is being stopped",
    }


def hold_by_labels(
    session: Session,
    principal: Principal,
    labels: Sequence[tuple[str, str | None]],
    *,
    scope: ColumnElement[bool] | None,
    now: float | None = None,
) -> HeldByLabels:
    """Hold every queued job the caller may see, within `scope` (`scope_condition`: whose), that
    carries all of `labels`, those not yet held first (`_pick`), at most MAX_BULK_JOBS (`more`:
    run it again), one transaction per job (services.holds.hold_job); what happened to each."""
    return _each_queued(session, principal, labels, scope, "hold", hold_job, now)


def release_by_labels(
    session: Session,
    principal: Principal,
    labels: Sequence[tuple[str, str | None]],
    *,
    scope: ColumnElement[bool] | None,
    now: float | None = None,
) -> HeldByLabels:
    """Release every queued job the caller may see, within `scope`, that carries all of `labels`
    (a job that is not held: `unchanged`), the held ones first (`_pick`), at most MAX_BULK_JOBS,
    one transaction per job (services.holds.release_job)."""
    return _each_queued(session, principal, labels, scope, "release", release_job, now)


def _each_queued(
    session: Session,
    principal: Principal,
    labels: Sequence[tuple[str, str | None]],
    scope: ColumnElement[bool] | None,
    verb: Literal["hold", "release"],
    act: Callable[..., HoldOutcome],
    now: float | None,
) -> HeldByLabels:
    if not labels:  # an empty selector would act on everything the caller can see
        raise Invalid(f"name at least one label (NAME=VALUE) whose jobs to {verb}", ("body", "labels"))
    now = time.time() if now is None else now
    flt = JobFilter(state=(JobState.QUEUED.value,), labels=labels)
    pending = Job.held_by.is_(None) if verb == "hold" else Job.held_by.is_not(None)
    ids, more = _pick(session, principal, flt, scope, pending)
    done: HoldSetOutcome = "held" if verb == "hold" else "released"
    items: list[HeldJob] = []
    for job_id in ids:
        try:
            outcome = act(session, principal, job_id, now=now)
        except (Conflict, Forbidden) as exc:
            session.rollback()
            job = session.get(Job, job_id, populate_existing=True)
            state, held = (None, None) if job is None else (job.state, is_held(job))
            items.append(
                {"id": job_id, "outcome": "refused", "state": state, "held": held, "message": exc.message}
            )
            continue
        except NotFound:
            session.rollback()
            message = f"job {job_id} is gone"
            items.append({"id": job_id, "outcome": "gone", "state": None, "held": None, "message": message})
            continue
        view = outcome["job"]
        items.append(
            {
                "id": job_id,
                "outcome": done if outcome["changed"] else "unchanged",
                "state": view["state"],
                "held": view["hold"] is not None,
                "message": outcome["message"],
            }
        )
    return {"matched": len(items), "more": more, "items": items}
