"""Live Slurm attempts whose status cannot be read: how long each has been so, when its traceback
is logged, and when it must end.

A status is read from the attempt's job dir, which the job's own account writes: whatever it
leaves there must not stop the poll of every other job (engine.SlurmEngine.poll leaves such an
attempt out, and it keeps its state). Nor may it keep the attempt, its GPUs and its Slurm job
forever: once unreadable for `grace_s` (CORRAL_SLURM_UNREADABLE_GRACE_S) while Slurm says its job
no longer runs, or twice that while it still runs, the attempt ends failed (docs/slurm.md).
The clock is this server's: a restart starts it again.
"""

from __future__ import annotations

import logging
import time

from corral.engine.base import AttemptPhase, AttemptStatus, FailureReason

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 600.0
MIN_GRACE_S, MAX_GRACE_S = 1.0, 7 * 86400.0
LOG_EVERY_S = 600.0  # an unreadable attempt's traceback this often at most
# Entries kept before old ones are dropped: an attempt still polled ends at twice its grace, so
# one first seen unreadable longer ago than that is no longer polled (cancelled, adopted elsewhere).
MAX_TRACKED = 1024
MAX_ERROR_CHARS = 400  # of the error's text in the failure's message (the job may choose its words)


class UnreadableAttempts:
    """Per attempt, since when (monotonic) its status could not be read; and the log's pace."""

    def __init__(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        if not MIN_GRACE_S <= grace_s <= MAX_GRACE_S:
            raise ValueError(
                f"CORRAL_SLURM_UNREADABLE_GRACE_S={grace_s:g} must be from {MIN_GRACE_S:g} to "
                f"{MAX_GRACE_S:g} seconds"
            )
        self.grace_s = grace_s
        self._since: dict[str, float] = {}
        self._logged: dict[str, float] = {}

    def unreadable_for(self, attempt_id: str) -> float:
        """Note that the attempt's status could not be read now; seconds since it first could not
        (0 the first time, or again after it was read)."""
        now = time.monotonic()
        if len(self._since) > MAX_TRACKED:
            stale = now - 3 * self.grace_s
            self._since = {aid: since for aid, since in self._since.items() if since > stale}
        return now - self._since.setdefault(attempt_id, now)

    def read(self, attempt_id: str) -> None:
        """Its status was read (or it ended): a later failure to read starts the clock again."""
        if self._since:  # a poll of every live attempt calls this: nothing to do most of the time
            self._since.pop(attempt_id, None)

    def due(self, unreadable_s: float, slurm_runs_it: bool) -> bool:
        """Whether an attempt unreadable for `unreadable_s` must now end: past the grace once
        Slurm says its job no longer runs (or knows it no more), past twice the grace while it runs."""
        return unreadable_s >= (2 * self.grace_s if slurm_runs_it else self.grace_s)

    def log_error(self, attempt_id: str) -> None:
        """The current exception's traceback, at most every LOG_EVERY_S per attempt."""
        now = time.monotonic()
        if now - self._logged.get(attempt_id, -LOG_EVERY_S) < LOG_EVERY_S:
            return
        if len(self._logged) > MAX_TRACKED:
            self._logged.clear()
        self._logged[attempt_id] = now
        log.exception(
            "Slurm attempt %s: its status could not be read; it keeps its state until it can be, its "
            "job is cancelled, or it fails after %.0f s of this (CORRAL_SLURM_UNREADABLE_GRACE_S) once "
            "Slurm says its job ended, twice that while it runs; logged again in %.0f s if it persists",
            attempt_id,
            self.grace_s,
            LOG_EVERY_S,
        )


def failed_status(
    attempt_id: str, slurm_job_id: str, unreadable_s: float, slurm_runs_it: bool, error: Exception
) -> AttemptStatus:
    """The attempt's end: FAILED, status_unreadable, its message saying for how long, what Slurm
    said of its job (cancelled: the engine kills a job still running) and the error."""
    slurm = f"Slurm job {slurm_job_id}" if slurm_job_id else "its Slurm job"
    why = f"{slurm} still ran: cancelled" if slurm_runs_it else f"{slurm} no longer runs"
    text = f"{type(error).__name__}: {error}"
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return AttemptStatus(
        attempt_id,
        AttemptPhase.FAILED,
        reason=FailureReason.STATUS_UNREADABLE,
        message=f"its status files were unreadable for {unreadable_s:.0f} s ({why}): {text}",
        finished_at=time.time(),
        engine_ref=slurm_job_id,
    )
