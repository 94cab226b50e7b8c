"""Ending an attempt: record how it ended, free its GPUs at once, charge its usage.

Used by every loop that sees an attempt end (reconcile, dispatch, node heartbeat), so the rules
are in one place: the GpuClaim rows go in the same transaction that records the end, which is
what makes resources free for the next job within one schedule cycle. The attempt's state itself
is written by services.lifecycle (compare-and-set); the job was settled before, by the caller.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.models import Attempt, GpuClaim, Job, UsageLedger
from corral.engine.base import FailureReason
from corral.server.snapshot import USAGE_HALF_LIFE_S, decayed
from corral.services.lifecycle import AttemptState, move_attempt


class AttemptChangedMeanwhile(RuntimeError):
    """The attempt's row was no longer live when its end was written, after its job was settled:
    the caller's transaction must be rolled back (the loops then retry one job at a time)."""


def attempt_gpus(attempt: Attempt) -> int:
    return sum(len(p.gpu_indices) for p in attempt.placement or ())


def charge_usage(session: Session, group: str, user: str, gpu_seconds: float, now: float) -> None:
    """Add GPU-seconds to the fair-share ledger, decaying what was there to `now` first."""
    if gpu_seconds <= 0:
        return
    row = session.get(UsageLedger, (group, user))
    # A row added earlier in this (unflushed) batch is not in the identity map yet: without this,
    # a batch ending two attempts of a new user added two rows and failed on the primary key.
    added: dict[tuple[str, str], UsageLedger] = session.info.setdefault("new_usage_rows", {})
    if row is None and (pending := added.get((group, user))) is not None and pending in session:
        row = pending
    if row is None:
        row = UsageLedger(group_name=group, user_name=user, gpu_seconds=gpu_seconds, updated_at=now)
        session.add(row)
        added[(group, user)] = row
        return
    row.gpu_seconds = decayed(row.gpu_seconds, row.updated_at, now, USAGE_HALF_LIFE_S) + gpu_seconds
    row.updated_at = max(now, row.updated_at)


def end_attempt(
    session: Session,
    job: Job,
    attempt: Attempt,
    state: AttemptState,
    now: float,
    *,
    exit_code: int | None = None,
    reason: FailureReason | str | None = None,
    message: str = "",
    ended_at: float | None = None,
) -> None:
    """Mark `attempt` ended (inside the caller's transaction, after its job was settled); raises
    AttemptChangedMeanwhile when another session ended it first."""
    values = {
        "ended_at": ended_at or now,
        "exit_code": exit_code,
        "reason": str(reason.value if isinstance(reason, FailureReason) else reason) if reason else None,
        **({"message": message} if message else {}),
    }
    if not move_attempt(session, attempt, state, values):
        raise AttemptChangedMeanwhile(f"attempt {attempt.attempt_id} ended in another session")
    # ORM deletes, written at commit with the rest of the batch (one executemany, not one each).
    # The claims are exactly the placement's GPUs (scheduling.write_batch): an attempt
    # placed without GPUs has none, and skips the query (a SELECT per ended CPU job).
    if attempt_gpus(attempt) > 0:
        for claim in session.scalars(select(GpuClaim).where(GpuClaim.attempt_pk == attempt.id)):
            session.delete(claim)
    if attempt.started_at is not None and attempt.ended_at is not None:
        gpu_seconds = attempt_gpus(attempt) * max(0.0, attempt.ended_at - attempt.started_at)
        job.attained_gpu_seconds += gpu_seconds
        charge_usage(session, job.group.name, job.user.name, gpu_seconds, now)


def claimed_gpus(session: Session) -> set[tuple[str, int]]:
    return {(c.node, c.gpu_index) for c in session.scalars(select(GpuClaim))}
