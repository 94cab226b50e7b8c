"""Live Slurm attempts whose status the poll could not read: how long each has been so, when its
traceback is logged, and when it must end.

Every read of the job dir that the job's own account can spoil (its `rank-R.exit` files, the bwrap
status files, the secrets' removal) already catches OSError and skips the file, so what is left to
fail a poll of one attempt is Corral's own: a bug, the server's state dir failing to save or mark
it, no thread to be had. That must not stop the poll of every other job (engine.SlurmEngine.poll
leaves such an attempt out of its answer, and it keeps its state), nor keep the attempt, its GPUs
and its Slurm job forever: once unreadable for `grace_s` (CORRAL_SLURM_UNREADABLE_GRACE_S) while
Slurm says its job no longer runs, or twice that while it still runs (then it is killed), the
attempt ends FAILED, status_unreadable: the platform's failure, retried as a lost node's attempt is
(docs/slurm.md). When each attempt was first found so is kept in a small file of its own under the
engine's state dir (SINCE_DIR/<attempt id>: its text the first time, its mtime when it was last
seen so, refreshed at most every PRUNE_EVERY_S; read at start), not in the attempt's record, whose
writes may be what fails: a server restarting more often than the grace would else start every
attempt's count again and never end one. At start a file last seen FORGET_AFTER_S ago or more is
forgotten, as a running server forgets (the downtime counts only as far as a gap between two
failed reads does in one process). Should that file not be written either, the count is this
process's alone, as it was.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from corral.engine.base import AttemptPhase, AttemptStatus, FailureReason
from corral.engine.slurm import mapping
from corral.engine.slurm.cli import SlurmJob
from corral.engine.slurm.state import StopRequest

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 600.0
MIN_GRACE_S, MAX_GRACE_S = 1.0, 7 * 86400.0
LOG_EVERY_S = 600.0  # an unreadable attempt's traceback (and an end not recorded) this often at most
# The bookkeeping is pruned by age at most this often, so a poll of thousands of unreadable
# attempts costs one dict look-up each, not a walk of all of them per attempt.
PRUNE_EVERY_S = 5.0
# An attempt not found unreadable for this long is forgotten (its job ended some other way, was
# cancelled or adopted elsewhere, or the poll could not reach Slurm): its clock starts again.
FORGET_AFTER_S = 600.0
MAX_ERROR_CHARS = 400  # of the error's text in the failure's message
# Under the engine's state dir, beside `attempts/`: a file per attempt whose status could not be
# read, named by its id, holding when (the wall clock's seconds) that was first so; its mtime is
# when that was last seen (refreshed at most every PRUNE_EVERY_S, so late by that at most).
SINCE_DIR = "unreadable"


class UnreadableAttempts:
    """Per attempt, since when (monotonic) its status could not be read and when that was last
    seen; and the log's pace. `clock`: time.monotonic (a test's own clock). `since_dir`: where the
    first and last times of each are kept across restarts (the engine's `<state dir>/SINCE_DIR`; None: in
    memory only), by `wall` (time.time: the monotonic clock does not outlive a reboot)."""

    def __init__(
        self,
        grace_s: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        since_dir: Path | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not MIN_GRACE_S <= grace_s <= MAX_GRACE_S:
            raise ValueError(
                f"CORRAL_SLURM_UNREADABLE_GRACE_S={grace_s:g} must be from {MIN_GRACE_S:g} to "
                f"{MAX_GRACE_S:g} seconds"
            )
        self.grace_s = grace_s
        self._clock = clock
        self._since: dict[str, tuple[float, float]] = {}  # attempt -> (first, last) seen unreadable
        self._logged: dict[str, float] = {}  # attempt -> when its read error was last logged
        self._end_logged: dict[str, float] = {}  # attempt -> when its end's failure was last logged
        self._marker_logged: dict[str, float] = {}  # attempt -> when its kill marker's failure was
        self._pruned_at = clock()
        self.prunes = 0  # how many times the entries were walked (tests count the work)
        # `corral exec` polls from an API thread beside the reconcile loop: one at a time here
        self._lock = threading.Lock()
        self._since_dir = since_dir
        self._wall = wall
        # the attempts with a file in since_dir (one whose removal failed too, until a prune removes it)
        self._kept: set[str] = set()
        self._touched: dict[str, float] = {}  # attempt -> when (clock) its file's mtime was last set
        # the attempts whose file's removal failed: tried again at every prune, whether or not the
        # attempt was found unreadable again since (its new file not written either, the old one
        # would be read at the next start as counting from the old first time, review127 #6)
        self._unremoved: set[str] = set()
        if since_dir is not None:
            self._load_kept(since_dir)

    def _load_kept(self, since_dir: Path) -> None:
        """At start: each attempt a file says was unreadable, its count going on from the first
        time and last seen at the file's mtime, as though this process had seen both (the time
        the server was down included, as a gap between two failed reads is in one process); one
        last seen FORGET_AFTER_S ago or more is forgotten, its file removed, as a prune would."""
        try:
            since_dir.mkdir(mode=0o700, exist_ok=True)
            names = os.listdir(since_dir)
        except OSError as exc:
            log.warning("%s cannot be read (%s): unreadable attempts are counted from now", since_dir, exc)
            return
        now, wall_now = self._clock(), self._wall()
        for name in names:
            path = since_dir / name
            times = _kept_times(path)
            if times is None or wall_now - times[1] >= FORGET_AFTER_S:
                if not _remove(path) and not name.startswith("."):
                    self._kept.add(name)  # (tried again at each prune)
                    self._unremoved.add(name)
                continue
            # (a wall clock stepped back since: counted from now, never a negative age)
            first, last = (now - max(0.0, wall_now - at) for at in times)
            self._since[name] = (first, last)
            self._touched[name] = last
            self._kept.add(name)

    @classmethod
    def kept_under(cls, state_dir: Path, grace_s: float) -> UnreadableAttempts:
        """The engine's: each first time kept in `state_dir`/SINCE_DIR."""
        return cls(grace_s, since_dir=state_dir / SINCE_DIR)

    def _keep(self, attempt_id: str) -> None:
        """Its first time in a file of its own (written once per time it becomes unreadable);
        should the state dir refuse it, the count is this process's alone, said in the log."""
        if self._since_dir is None:
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=self._since_dir, prefix=".tmp-")  # 0600
            wall = self._wall()
            with os.fdopen(fd, "w") as f:
                f.write(f"{wall:.3f}\n")
            os.utime(tmp, (wall, wall))  # (last seen: now, on the same clock as the first time)
            os.replace(tmp, self._since_dir / attempt_id)
        except OSError as exc:
            log.warning(
                "Slurm attempt %s: when its status was first unreadable could not be kept in %s (%s): "
                "a restart of the server counts it from then",
                attempt_id,
                self._since_dir,
                exc,
            )
            return
        self._kept.add(attempt_id)
        self._unremoved.discard(attempt_id)  # (the file is this time's now)
        self._touched[attempt_id] = self._clock()

    def _seen_again(self, attempt_id: str, now: float) -> None:
        """Its file's mtime set to now (when it was last seen unreadable), at most every
        PRUNE_EVERY_S: a restart forgets it only if it was not seen so for FORGET_AFTER_S."""
        touched = self._touched.get(attempt_id)
        if self._since_dir is None or touched is None or now - touched < PRUNE_EVERY_S:
            return
        self._touched[attempt_id] = now
        wall = self._wall()
        try:
            os.utime(self._since_dir / attempt_id, (wall, wall))
        except OSError:
            pass  # (the dir refuses it: a restart may forget the attempt early, never count it longer)

    def _unkeep(self, attempt_id: str, log_failure: bool = True) -> None:
        """Its file gone with its entry (read well, ended, or forgotten); one the state dir would
        not remove stays kept, and each prune tries it again (else it would be read at the next
        start as an attempt still unreadable)."""
        self._touched.pop(attempt_id, None)
        if attempt_id not in self._kept or self._since_dir is None:
            return
        if _remove(self._since_dir / attempt_id, log_failure):
            self._kept.discard(attempt_id)
            self._unremoved.discard(attempt_id)
        else:
            self._unremoved.add(attempt_id)

    def unreadable_for(self, attempt_id: str) -> float:
        """Note that the attempt's status could not be read now; seconds since it first could not
        (0 the first time, or again after it was read or forgotten)."""
        with self._lock:
            now = self._clock()
            self._prune(now)
            seen = self._since.get(attempt_id)
            if seen is None:
                self._since[attempt_id] = (now, now)
                self._keep(attempt_id)
                return 0.0
            self._since[attempt_id] = (seen[0], now)
            self._seen_again(attempt_id, now)
            return now - seen[0]

    def read(self, attempt_id: str) -> None:
        """Its status was read (or it ended): a later failure to read starts the clock again."""
        # (a poll of every live attempt calls this: nothing to do most of the time)
        if self._since or self._kept:
            with self._lock:
                self._prune(self._clock())  # (entries read from files at start of attempts no longer polled)
                if self._since.pop(attempt_id, None) is not None:
                    self._unkeep(attempt_id)

    def due(self, unreadable_s: float, slurm_runs_it: bool) -> bool:
        """Whether an attempt unreadable for `unreadable_s` must now end: past the grace once
        Slurm says its job no longer runs (or knows it no more), past twice the grace while it runs."""
        return unreadable_s >= (2 * self.grace_s if slurm_runs_it else self.grace_s)

    def log_error(self, attempt_id: str) -> None:
        """The current exception's traceback (the status not read), at most every LOG_EVERY_S per
        attempt."""
        if not self._log_due(self._logged, attempt_id):
            return
        log.exception(
            "Slurm attempt %s: its status could not be read; it keeps its state until it can be, its "
            "job is cancelled, or it fails after %.0f s of this (CORRAL_SLURM_UNREADABLE_GRACE_S) once "
            "Slurm says its job ended, twice that while it runs; logged again in %.0f s if it persists",
            attempt_id,
            self.grace_s,
            LOG_EVERY_S,
        )

    def log_end_error(self, attempt_id: str) -> None:
        """The current exception's traceback (the attempt's end as status_unreadable not
        recorded): on a pace of its own, so the read errors logged before never hide it."""
        if not self._log_due(self._end_logged, attempt_id):
            return
        log.exception(
            "Slurm attempt %s: its end (status_unreadable) could not be recorded; tried again at the "
            "next poll, logged again in %.0f s if it persists",
            attempt_id,
            LOG_EVERY_S,
        )

    def log_marker_error(self, attempt_id: str, error: OSError) -> None:
        """A kill marker the state dir refused (the scancels went all the same; a later poll tries
        both again while the attempt lives), at most every LOG_EVERY_S per attempt."""
        if self._log_due(self._marker_logged, attempt_id):
            log.warning(
                "kill of %s: its kill marker could not be written (%s); scancel sent, both tried "
                "again at a later poll while it lives; logged again in %.0f s if it persists",
                attempt_id,
                error,
                LOG_EVERY_S,
            )

    def _log_due(self, logged: dict[str, float], attempt_id: str) -> bool:
        """Whether the attempt's log in `logged` is due now (then it is noted as logged)."""
        with self._lock:
            now = self._clock()
            self._prune(now)
            last = logged.get(attempt_id)
            if last is not None and now - last < LOG_EVERY_S:
                return False
            logged[attempt_id] = now
            return True

    def _prune(self, now: float) -> None:
        """Forget, at most every PRUNE_EVERY_S, the attempts not seen unreadable for FORGET_AFTER_S
        and the logs older than LOG_EVERY_S (no longer holding a log back)."""
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        self.prunes += 1
        seen = now - FORGET_AFTER_S
        for aid in [aid for aid, times in self._since.items() if times[1] <= seen]:
            del self._since[aid]
            self._unkeep(aid)
        if self._since_dir is not None:
            for aid in [aid for aid in self._unremoved if _remove(self._since_dir / aid, log_failure=False)]:
                self._unremoved.discard(aid)  # (its file gone: the attempt, if unreadable again,
                self._kept.discard(aid)  # is counted in memory only, as when its _keep failed)
        for logged in (self._logged, self._end_logged, self._marker_logged):  # in place: _log_due holds one
            for aid in [aid for aid, at in logged.items() if now - at >= LOG_EVERY_S]:
                del logged[aid]


def _kept_times(path: Path) -> tuple[float, float] | None:
    """The wall-clock times a file of SINCE_DIR holds: first (its text) and last (its mtime) seen
    unreadable; None for one that holds none: _keep's temporary file (a name with a dot first)
    or a write cut short, a directory, an unreadable one."""
    if path.name.startswith("."):
        return None
    try:
        return float(path.read_text()), path.stat().st_mtime
    except (OSError, ValueError):
        return None


def _remove(path: Path, log_failure: bool = True) -> bool:
    """Whether `path` is gone (removed now, or already)."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        if log_failure:
            log.warning("%s could not be removed (%s): tried again every %.0f s", path, exc, PRUNE_EVERY_S)
        return False
    return True


def failed_status(
    attempt_id: str, slurm_job_id: str, unreadable_s: float, slurm_runs_it: bool, error: Exception
) -> AttemptStatus:
    """The attempt's end: FAILED, status_unreadable, its message saying that Corral could not read
    how it ended, for how long, what Slurm said of its job (cancelled: the engine kills a job
    still running) and the error (the traceback is in the server's log)."""
    slurm = f"Slurm job {slurm_job_id}" if slurm_job_id else "its Slurm job"
    why = f"{slurm} still ran: cancelled" if slurm_runs_it else f"{slurm} no longer runs"
    text = f"{type(error).__name__}: {error}"
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return AttemptStatus(
        attempt_id,
        AttemptPhase.FAILED,
        reason=FailureReason.STATUS_UNREADABLE,
        message=f"Corral could not read how its instances ended for {unreadable_s:.0f} s ({why}): "
        f"{text} (the traceback is in the server's log)",
        finished_at=time.time(),
        engine_ref=slurm_job_id,
    )


# Slurm states of RUNNING_STATES whose job has ended (its epilog, burst buffer stage-out, an exit
# being handled): squeue's end time is the job's real end there, not the limit's projection.
ENDED_BUT_LISTED = frozenset({"COMPLETING", "STAGE_OUT", "SPECIAL_EXIT"})


def time_limit_end(stop: StopRequest | None, job: SlurmJob | None, slurm_runs_it: bool) -> str | None:
    """Why an attempt whose end could not be read ended by its time limit ("exceeded max_runtime",
    or Slurm's TIMEOUT/DEADLINE), or None: in terminal_status's order, so the unread end is a
    timeout exactly where the read one would have been. A lost node comes first; then the stop
    Corral asked (its own kind decides: a stop for a fault is no timeout however Slurm ended the
    job), counted while Slurm still runs the job (squeue's end time is then only the limit's
    projection) or when asked before the job's own end; then Slurm's own state."""
    # Slurm no longer knows it: the stop asked decides (_status_without_slurm would say node_lost
    # where some rank left no exit code, which cannot be told while they cannot be read)
    if job is None:
        return "exceeded max_runtime" if stop is not None and stop.kind == "timeout" else None
    state = mapping.slurm_state(job)
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return None
    running = slurm_runs_it and state not in ENDED_BUT_LISTED  # (their end time is a real end)
    kind = (stop.kind if stop is not None else None) if running else mapping.stop_kind(stop, job)
    if kind is not None:
        return "exceeded max_runtime" if kind == "timeout" else None
    return f"Slurm time limit ({state})" if state in ("TIMEOUT", "DEADLINE") else None
