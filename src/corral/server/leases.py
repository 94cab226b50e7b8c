"""Leases: how two server processes on one database avoid doing the same work twice.

Singleton loops hold a row in `leases` (name, owner, until). Per-job work (dispatch, stop) claims
the job row with `Job.lease_owner` / `Job.lease_until`. Both are taken with one conditional UPDATE
(`... WHERE owner = me OR until < now`), which PostgreSQL and SQLite evaluate atomically, so only
one process can win a given lease at a time.
"""

from __future__ import annotations

from sqlalchemy import or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.db.models import Job, Lease

LOOP_LEASE_TTL_S = 5.0
JOB_LEASE_TTL_S = 10.0


def claim_lease(session: Session, name: str, owner: str, now: float, ttl_s: float = LOOP_LEASE_TTL_S) -> bool:
    """Take or renew the singleton lease `name` for `owner`; commits. True when `owner` holds it."""
    result = session.execute(
        update(Lease)
        .where(Lease.name == name, or_(Lease.owner == owner, Lease.until < now))
        .values(owner=owner, until=now + ttl_s)
    )
    if result.rowcount == 1:  # type: ignore[attr-defined]
        session.commit()
        return True
    session.rollback()
    if session.get(Lease, name) is not None:
        session.rollback()
        return False
    try:
        session.add(Lease(name=name, owner=owner, until=now + ttl_s))
        session.commit()
        return True
    except IntegrityError:  # another process inserted it first
        session.rollback()
        return False


def release_lease(session: Session, name: str, owner: str) -> None:
    session.execute(update(Lease).where(Lease.name == name, Lease.owner == owner).values(until=0.0))
    session.commit()


def claim_job(session: Session, job_id: int, owner: str, now: float, ttl_s: float = JOB_LEASE_TTL_S) -> bool:
    """Claim one job row for per-row work, inside the caller's transaction (not committed here)."""
    result = session.execute(
        update(Job)
        .where(
            Job.id == job_id,
            or_(Job.lease_owner.is_(None), Job.lease_owner == owner, Job.lease_until < now),
        )
        .values(lease_owner=owner, lease_until=now + ttl_s)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]
