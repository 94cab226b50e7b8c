"""Usage accounting: GPU-hours and CPU-hours per user or per group over a period, computed from
the attempts' own records (started_at / ended_at and the placement's GPUs and CPUs).

- An attempt counts for the part of its run inside [since, until): a running attempt up to now.
  An attempt that never started (no started_at) counts nothing; nor does a finished one whose end
  was never recorded (its length is unknown).
- GPUs are those placed (`gpu_indices` of every instance), CPUs the CPUs requested per instance:
  what the job held, whether or not it used it.
- Who sees what: the visibility of jobs (a member their own jobs' usage, a group admin also their
  groups', an admin everything), so a report never reveals jobs its reader could not list.
- Deleting a job (or its expiry under retention) removes its attempts and so its usage: keep
  jobs longer than the periods you account for.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from corral.db.models import Attempt, Group, Job, User
from corral.domain import InstancePlacement
from corral.services.audit import parse_time
from corral.services.auth import Principal
from corral.services.errors import Invalid
from corral.services.jobs import visibility
from corral.services.lifecycle import AttemptState
from corral.services.views import utc_text

DEFAULT_PERIOD_S = 30 * 86400.0
LIVE_ATTEMPT_STATES = tuple(s.value for s in AttemptState if not s.finished)


class UsageBy(StrEnum):
    USER = "user"
    GROUP = "group"


@dataclass(frozen=True, slots=True)
class UsageRow:
    name: str  # the user's or the group's name
    gpu_hours: float
    cpu_hours: float
    jobs: int
    attempts: int


@dataclass(frozen=True, slots=True)
class UsageReport:
    since: float
    until: float
    by: UsageBy
    rows: tuple[UsageRow, ...]  # most GPU-hours first, then most CPU-hours, then by name
    total: UsageRow


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """What accounting needs of one attempt."""

    job_id: int
    user: str
    group: str
    started_at: float
    ended_at: float | None  # None: still running
    gpus: int
    cpus: float


def overlap_s(start: float, end: float, since: float, until: float) -> float:
    return max(0.0, min(end, until) - max(start, since))


def placed_resources(placement: Iterable[InstancePlacement]) -> tuple[int, float]:
    """(GPUs, CPUs) an attempt's placement held across all its instances."""
    return sum(len(p.gpu_indices) for p in placement), sum(p.cpus for p in placement)


def parse_bound(value: str | None, now: float, field: str) -> float | None:
    """`since` or `until` as `GET /usage` takes it: the forms `GET /audit` takes (an age such as
    "7d", "12h" or "30m" before now, unix seconds, or an ISO time), by the same parser; a 422
    naming the field and the value when it is none of them or outside 1970 to the year 5138."""
    if value is None or not value.strip():
        return None
    return parse_time(value, now, field)


def check_period(since: float | None, until: float | None, now: float) -> tuple[float, float]:
    until = now if until is None else until
    since = until - DEFAULT_PERIOD_S if since is None else since
    if since >= until:
        raise Invalid(
            f"'since' ({utc_text(since)}) must be before 'until' ({utc_text(until)})", ("query", "since")
        )
    return since, until


def attempts_in_period(
    session: Session, principal: Principal, since: float, until: float
) -> list[AttemptRecord]:
    """Every visible attempt that ran for some part of [since, until), in one query."""
    still_running = and_(Attempt.ended_at.is_(None), Attempt.state.in_(LIVE_ATTEMPT_STATES))
    conds = [
        Attempt.started_at.is_not(None),
        Attempt.started_at < until,
        or_(Attempt.ended_at > since, still_running),
    ]
    visible = visibility(principal)
    if visible is not None:
        conds.append(visible)
    rows = session.execute(
        select(Attempt.job_id, User.name, Group.name, Attempt.started_at, Attempt.ended_at, Attempt.placement)
        .join(Job, Job.id == Attempt.job_id)
        .join(User, User.id == Job.user_id)
        .join(Group, Group.id == Job.group_id)
        .where(*conds)
    ).all()
    out = []
    for job_id, user, group, started, ended, placement in rows:
        gpus, cpus = placed_resources(placement or ())
        out.append(AttemptRecord(job_id, user, group, float(started or 0.0), ended, gpus, cpus))
    return out


def summarize(
    records: Sequence[AttemptRecord], by: UsageBy, since: float, until: float, now: float
) -> UsageReport:
    """Pure: the report of these attempts over [since, until), running ones counted up to `now`."""
    gpu_s: dict[str, float] = {}
    cpu_s: dict[str, float] = {}
    jobs: dict[str, set[int]] = {}
    attempts: dict[str, int] = {}
    for r in records:
        seconds = overlap_s(r.started_at, now if r.ended_at is None else r.ended_at, since, until)
        # an attempt that started in the period ran even when its times say 0 s: Slurm's are
        # whole seconds, and a job of under a second was left out of the jobs and attempts counts
        if seconds <= 0.0 and not since <= r.started_at < until:
            continue
        key = r.user if by is UsageBy.USER else r.group
        gpu_s[key] = gpu_s.get(key, 0.0) + r.gpus * seconds
        cpu_s[key] = cpu_s.get(key, 0.0) + r.cpus * seconds
        jobs.setdefault(key, set()).add(r.job_id)
        attempts[key] = attempts.get(key, 0) + 1
    rows = sorted(
        (UsageRow(k, gpu_s[k] / 3600.0, cpu_s[k] / 3600.0, len(jobs[k]), attempts[k]) for k in gpu_s),
        key=lambda row: (-row.gpu_hours, -row.cpu_hours, row.name),
    )
    total = UsageRow(
        "total",
        sum(r.gpu_hours for r in rows),
        sum(r.cpu_hours for r in rows),
        len(set().union(*jobs.values())) if jobs else 0,
        sum(attempts.values()),
    )
    return UsageReport(since, until, by, tuple(rows), total)


def usage_report(
    session: Session,
    principal: Principal,
    *,
    since: float | None = None,
    until: float | None = None,
    by: str = "user",
    now: float | None = None,
) -> UsageReport:
    """GPU-hours and CPU-hours per user or group over [since, until) (default: the last 30 days)."""
    now = time.time() if now is None else now
    try:
        grouping = UsageBy(by)
    except ValueError:
        raise Invalid(f"cannot report usage by {by!r}; use 'user' or 'group'", ("query", "by")) from None
    since, until = check_period(since, until, now)
    return summarize(attempts_in_period(session, principal, since, until), grouping, since, until, now)
