"""The engine sweep: stops what the engine still runs for attempts the database has ended.

Every path that ends a live attempt in the database (the node loop's lost node, dispatch's failed
launch, a cancel of a launch never recorded) commits first and stops the engine's attempt after
(a stop before the commit could leave the end on record as Corral's own stop: see
architecture.md). A server killed between the two leaves the attempt running with its row ended:
on a node that comes back, or a supervisor that never noticed, it runs beside the retry and nobody
stops it. This leased singleton loop asks the engine which attempts it still runs
(`ListsAttempts`: the local engine's attempts without a final status, from its live index) and
stops, with grace 0, each whose row is ended, logging and auditing it (`attempt.stop_ended`,
actor `system:sweep`).

Never stopped: an attempt whose row is live (starting or running: the reconcile loop's), and one
without a row. The engine is listed before the rows are read, in a transaction of its own begun
after the listing: an attempt is launched only after its row was committed (SCHEDULED, by the
schedule loop), so every attempt listed has a row this read sees, unless it belongs to no job of
this database (a deleted job, whose engine copy goes first; another database on the same home):
not ours to judge. An ended attempt never runs again (a retry is a new attempt, `<job>.<n+1>`),
so stopping one whose row ended a moment ago is never wrong: at worst it repeats the stop of the
path that ended it (stops are idempotent).
"""

from __future__ import annotations

import logging

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from corral.db.models import Attempt
from corral.engine.base import ListsAttempts
from corral.server.context import ServerContext
from corral.services import audit
from corral.services.lifecycle import AttemptState

log = logging.getLogger("corral.server.sweep")
SWEEP_INTERVAL_S = 5.0
SWEEP_BATCH = 500  # attempt ids per read of their rows
# A stopped attempt still listed (its supervisor killing a stubborn process, a grace-0 stop of
# an engine that is slow to end it) is stopped and audited again only after this long.
SWEEP_AGAIN_S = 60.0
ACTOR = "system:sweep"
LIVE_STATES = frozenset(s.value for s in AttemptState if not s.finished)


def _parse(attempt_id: str) -> tuple[int, int] | None:
    job, _, number = attempt_id.partition(".")
    if not (job.isdigit() and number.isdigit()):
        return None
    return int(job), int(number)


def ended_rows(session: Session, attempt_ids: list[str]) -> dict[str, tuple[str, str | None]]:
    """attempt id -> (state, reason) of those whose row is ended; ids without a row are left out."""
    keys = [k for k in (_parse(a) for a in attempt_ids) if k is not None]
    out: dict[str, tuple[str, str | None]] = {}
    for i in range(0, len(keys), SWEEP_BATCH):
        batch = keys[i : i + SWEEP_BATCH]
        rows = session.execute(
            select(Attempt.job_id, Attempt.number, Attempt.state, Attempt.reason).where(
                tuple_(Attempt.job_id, Attempt.number).in_(batch)
            )
        ).all()
        for job_id, number, state, reason in rows:
            if state not in LIVE_STATES:
                out[f"{job_id}.{number}"] = (state, reason)
    return out


def sweep_tick(ctx: ServerContext, now: float) -> list[str]:
    """One pass; returns the attempt ids it stopped."""
    engine = ctx.engine
    if not isinstance(engine, ListsAttempts):
        return []
    swept = ctx.memory.swept
    for attempt_id, at in list(swept.items()):
        if now - at >= SWEEP_AGAIN_S:
            del swept[attempt_id]
    # Listed before the rows are read: see the module's docstring.
    running = [a for a in engine.active_attempts() if a not in swept]
    if not running:
        return []
    with ctx.session_factory() as session:
        ended = ended_rows(session, running)
        session.rollback()  # end the read before the engine calls
        stopped: list[str] = []
        for attempt_id, (state, reason) in sorted(ended.items()):
            try:
                engine.stop(attempt_id, 0.0)
            except Exception:
                log.exception(
                    "sweep: could not stop attempt %s (ended %s in the database)", attempt_id, state
                )
                continue
            stopped.append(attempt_id)
            swept[attempt_id] = now
            log.warning(
                "sweep: stopped attempt %s, still running in the engine but ended %s (%s) in the database",
                attempt_id,
                state,
                reason or "-",
            )
            audit.record(
                session,
                actor=ACTOR,
                action="attempt.stop_ended",
                target_kind="attempt",
                target_id=attempt_id,
                before={"state": state, "reason": reason},
                detail="the engine still ran an attempt the database had ended; stopped (grace 0)",
                now=now,
            )
        if stopped:
            session.commit()
    return stopped


def sweep_loop_tick(ctx: ServerContext, now: float) -> None:
    sweep_tick(ctx, now)  # the loop reads a tick's return as when to tick next: not this list
