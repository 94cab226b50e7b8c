"""Why a job waits and its logs: `waiting_status` (what `corral logs`, `corral ws show` and the
API show of a job that has not started yet) and `read_logs` (one instance's log, a page at a
time, never cut inside a UTF-8 character). Split from corral.services.jobs, which submits,
lists and cancels."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypedDict

from corral.db.models import Job
from corral.domain import start_text
from corral.services.errors import Invalid, NotFound
from corral.services.jobs import EngineMissing
from corral.services.lifecycle import JobState
from corral.services.views import effective_diagnosis

if TYPE_CHECKING:
    from corral.engine.base import Engine as ExecutionEngine


WAITING_STATES = (JobState.QUEUED, JobState.SCHEDULED, JobState.STARTING)


class WaitingReason(TypedDict):
    code: str
    source: str
    message: str


class WaitingStatus(TypedDict):
    """Why a job waits (the API's WaitingOut)."""

    state: str
    message: str
    reasons: list[WaitingReason]
    queue_position: int | None
    estimated_start: float | None
    unschedulable: bool
    start_range: list[float] | None
    held: bool


class LogsPage(TypedDict):
    """A chunk of one instance's log (the API's LogsOut)."""

    data: str
    next_offset: int
    eof: bool
    attempt: int | None
    rank: int
    waiting: WaitingStatus | None


def waiting_status(job: Job) -> WaitingStatus | None:
    """Why a job that has not started (again) is waiting, from the scheduler's last diagnosis:
    what `corral logs` shows instead of an empty screen. None once the job runs or has ended."""
    state = JobState(job.state)
    if state not in WAITING_STATES:
        return None
    diagnosis = effective_diagnosis(job)  # a held job's: its hold, with no position or time
    reasons = list(diagnosis.reasons) if diagnosis is not None else []
    position = diagnosis.queue_position if diagnosis is not None else None
    estimate = diagnosis.estimated_start if diagnosis is not None else None
    unschedulable = diagnosis is not None and diagnosis.unschedulable
    start_range = diagnosis.start_range if diagnosis is not None else None
    held = diagnosis is not None and diagnosis.held  # on hold, or held back by its quota or cap
    on_hold = diagnosis is not None and diagnosis.on_hold
    if state is JobState.QUEUED:
        why = "; ".join(r.message for r in reasons) or "the scheduler has not looked at it yet"
        parts = [f"job {job.id} is queued: {why}"]
        if position is not None:
            parts.append(f"position {position} in the queue")
        if unschedulable:
            parts.append("it cannot run on the cluster as it stands")
        elif held and not on_hold:  # a hold's own reason says so, naming its release
            parts.append("no estimated start while it is held back")
        elif estimate is not None:
            parts.append(f"estimated start {start_text(estimate, start_range, time.time())}")
        message = "; ".join(parts)
    else:
        live = max(job.attempts, key=lambda a: a.number, default=None)
        # the engine's words on a job it holds (Slurm's pending reason), else the usual wait
        says = live.message if live is not None and live.message else "its processes are being started"
        message = f"job {job.id} is {state.value}: {says}; no output yet"
    return {
        "state": state.value,
        "message": message,
        "reasons": [{"code": r.code, "source": r.source, "message": r.message} for r in reasons],
        "queue_position": position,
        "estimated_start": estimate,
        "unschedulable": unschedulable,
        "start_range": None if start_range is None else list(start_range),
        "held": held,
    }


def _complete_utf8_length(data: bytes) -> int:
    """How much of `data` holds no UTF-8 character cut at its end: its length less the first
    bytes (at most 3) of a character whose other bytes have not been read yet."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: ASCII or a character's first byte
            size = 1 if byte < 0xC0 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) - back if size > back else len(data)
    return len(data)


def read_logs(
    engine: ExecutionEngine | None, job: Job, *, attempt: int | None, rank: int, offset: int, limit: int
) -> LogsPage:
    """Logs of one instance (by rank) of one attempt (default: the newest) from byte `offset`,
    with `waiting` (waiting_status) while the job waits. `engine` is the execution engine (None:
    this server runs none); a job with no attempt yet needs none."""
    from corral.engine.base import LogChunk

    waiting = waiting_status(job)
    if not job.attempts:
        return {
            "data": "",
            "next_offset": 0,
            "eof": JobState(job.state).terminal,
            "attempt": None,
            "rank": rank,
            "waiting": waiting,
        }
    chosen = (
        job.attempts[-1] if attempt is None else next((a for a in job.attempts if a.number == attempt), None)
    )
    if chosen is None:
        raise NotFound(f"job {job.id} has no attempt {attempt}")
    instances = max(1, len(chosen.placement or []))
    if not 0 <= rank < instances:
        raise Invalid(f"rank must be between 0 and {instances - 1} for this attempt", ("query", "rank"))
    if engine is None:
        raise EngineMissing("logs are unavailable: this server has no execution engine running")
    chunk: LogChunk = engine.logs(chosen.attempt_id, instance=rank, offset=offset, limit=limit)
    data, next_offset = chunk.data, chunk.next_offset
    if not chunk.eof:
        # A chunk may end inside a multi-byte character (the page's limit, or a process's buffer
        # flushed mid-character): its first bytes are left for the next read, which then decodes
        # the whole character. Decoded as it was, each half became U+FFFD: `corral logs` and the
        # portal showed "��" for a "é" or a progress bar's "█" at every such boundary.
        # (Never down to nothing: a `limit` under a character's size must still make progress.)
        keep = _complete_utf8_length(data) or len(data)
        data, next_offset = data[:keep], next_offset - (len(data) - keep)
    return {
        # Decoded leniently all the same: a log is what the job wrote, valid UTF-8 or not.
        "data": data.decode("utf-8", errors="replace"),
        "next_offset": next_offset,
        "eof": chunk.eof,
        "attempt": chosen.number,
        "rank": rank,
        "waiting": waiting,
    }
