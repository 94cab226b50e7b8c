"""Ending an attempt: record how it ended, free its GPUs at once, charge its usage.

Used by every loop that sees an attempt end (reconcile, dispatch, node heartbeat), so the rules
are in one place: the GpuClaim rows go in the same transaction that records the end, which is
what makes resources free for the next job within one schedule cycle. The attempt's state itself
is written by services.lifecycle (compare-and-set); the job was settled before, by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.models import Attempt, GpuClaim, Job, UsageLedger
from corral.engine.base import FailureReason
from corral.server.snapshot import USAGE_HALF_LIFE_S, decayed
from corral.services.lifecycle import AttemptState, move_attempt, move_attempts
from corral.services.nodes import attempt_gpus, release_claims


class AttemptChangedMeanwhile(RuntimeError):
    """The attempt's row was no longer live when its end was written, after its job was settled:
    the caller's transaction must be rolled back (the loops then retry one job at a time)."""


def charge_usage(session: Session, group: str, user: str, gpu_seconds: float, now: float) -> None:
    """Add GPU-seconds to the fair-share ledger, decaying what was there to `now` first."""
    if gpu_seconds <= 0:
        return
    # A row added earlier in this (unflushed) batch is not in the identity map yet: without this,
    # a batch ending two attempts of a new user added two rows and failed on the primary key.
    added: dict[tuple[str, str], UsageLedger] = session.info.setdefault("new_usage_rows", {})
    row = pending if (pending := added.get((group, user))) is not None and pending in session else None
    ledger: dict[tuple[str, str], UsageLedger] | None = session.info.get("usage_rows")
    if row is None and ledger is not None:
        # The whole ledger by (group, user), read in this transaction by the batch (reconcile's
        # prefetch): a user with no row yet gets one without a SELECT per ended attempt.
        row = ledger.get((group, user))
    elif row is None:
        row = session.get(UsageLedger, (group, user))
    if row is None:
        row = UsageLedger(group_name=group, user_name=user, gpu_seconds=gpu_seconds, updated_at=now)
        session.add(row)
        added[(group, user)] = row
        return
    row.gpu_seconds = decayed(row.gpu_seconds, row.updated_at, now, USAGE_HALF_LIFE_S) + gpu_seconds
    row.updated_at = max(now, row.updated_at)


def end_values(
    now: float,
    *,
    exit_code: int | None = None,
    reason: FailureReason | str | None = None,
    message: str = "",
    ended_at: float | None = None,
) -> dict[str, object]:
    """The columns an ended attempt's row gets with its state."""
    return {
        "ended_at": ended_at or now,
        "exit_code": exit_code,
        "reason": str(reason.value if isinstance(reason, FailureReason) else reason) if reason else None,
        **({"message": message} if message else {}),
    }


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
    values = end_values(now, exit_code=exit_code, reason=reason, message=message, ended_at=ended_at)
    if not move_attempt(session, attempt, state, values):
        raise AttemptChangedMeanwhile(f"attempt {attempt.attempt_id} ended in another session")
    _release(session, [(job, attempt)], now)


def end_attempts(
    session: Session,
    ends: Sequence[tuple[Job, Attempt, Mapping[str, object]]],
    state: AttemptState,
    now: float,
) -> None:
    """`end_attempt` for a batch whose jobs were settled: one compare-and-set for all attempts
    (each with its own `end_values`), one SELECT of their GPU claims. Raises
    AttemptChangedMeanwhile when another session ended any of them first (the caller rolls the
    whole batch back and records it one job at a time)."""
    if not ends:
        return
    won = move_attempts(session, [a for _, a, _ in ends], state, {a.id: v for _, a, v in ends})
    lost = [a.attempt_id for _, a, _ in ends if a.id not in won]
    if lost:
        raise AttemptChangedMeanwhile(
            f"{'attempt' if len(lost) == 1 else 'attempts'} {', '.join(lost)} ended in another session"
        )
    _release(session, [(job, attempt) for job, attempt, _ in ends], now)


def _release(session: Session, ended: Sequence[tuple[Job, Attempt]], now: float) -> None:
    """Free the ended attempts' GPUs and charge their usage (in the caller's transaction)."""
    release_claims(session, [attempt for _, attempt in ended])
    for job, attempt in ended:
        if attempt.started_at is not None and attempt.ended_at is not None:
            gpu_seconds = attempt_gpus(attempt) * max(0.0, attempt.ended_at - attempt.started_at)
            job.attained_gpu_seconds += gpu_seconds
            charge_usage(session, job.group.name, job.user.name, gpu_seconds, now)


def claimed_gpus(session: Session) -> set[tuple[str, int]]:
    return {(c.node, c.gpu_index) for c in session.scalars(select(GpuClaim))}
