"""The one owner of job, attempt, node and GPU state: transition tables and compare-and-set writes.

Every write of `Job.state`, `Attempt.state`, `Node.state` and `Gpu.health` is made here, as

    UPDATE <table> SET state = :target, ... WHERE <key> = :key AND state = :expected

with the row count checked (for a batch, `schedule_jobs`, `transition_jobs` and `move_attempts`:
one such UPDATE for every row that moves the same way, `WHERE id IN (...)`, with `RETURNING id`
telling which rows were written). `expected` is the state the caller's (possibly stale) copy shows; when
another session changed the row meanwhile the UPDATE matches nothing and the function returns
False: the caller sees a lost race and does nothing more, nothing is overwritten. A terminal state
is never the `from` of an allowed transition, so the CAS makes it final in the database itself.
The job's JobEvent is added to the same session (same transaction), and so is its notification
outbox row when its spec's `notify` asks for the move (`queue_notifications`). After a successful write the
ORM object gets the written values as *committed* values, so the session stays consistent and its
flush does not write them again; after a lost race the object's state is expired (re-read on use).
tests/server/test_lifecycle_owner.py fails when any other module writes these columns.

Jobs      QUEUED -> SCHEDULED -> STARTING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
          STARTING | RUNNING -> PREEMPTED -> QUEUED;  ended attempt with a retry or loss budget left -> QUEUED
          a QUEUED job may be held (`hold`: held_by/held_at set, state unchanged, never scheduled)
          and released (`release`), each by compare-and-set on (state = QUEUED, its hold)
Attempts  SCHEDULED -> STARTING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED | PREEMPTED | LOST
Nodes     ready | cordoned | draining | down | unknown (operator's admin_state merged with the
          engine's report; down and unknown return to service when the engine reports them again)
GPUs      healthy <-> quarantined; healthy | quarantined -> lost -> healthy (an operator's decision)

How an ended attempt settles its job (`settle_attempt_end`), first rule that applies wins:
1. exit 0 before Corral asked the attempt to stop: SUCCEEDED, whatever cancel or preemption was
   pending (its work is done; running it again would do it twice). An exit 0 after the stop was
   sent is the job answering the stop (e.g. a checkpoint on SIGTERM), so rules 2-3 apply;
2. cancel requested: CANCELLED;
3. preempted: back to QUEUED (costs no budget; counted in `Job.preemptions`);
4. exit 0: SUCCEEDED;
5. lost (attempt, supervisor, node or engine lost: `settle_lost_work`, the one rule for lost
   work): QUEUED while the job's platform-loss budget (CORRAL_LOST_REQUEUE_BUDGET, default 3)
   lasts, else FAILED; a loss is not the job's fault, so it never uses up `retries:`;
6. failed (`settle_failure`): the exit-spec classification, when there is one, decides whether
   the failure may be retried at all (`retryable=False` or a `RetryRule` with cap 0: FAILED at
   once) and whose budget it uses: the job's own failures (user category) QUEUED while
   <= `retries:` (and the rule's cap), else FAILED; failures that are not the job's (transient,
   platform, hardware) QUEUED while the platform losses stay within the budget and the cap.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar, cast

from sqlalchemy import ColumnElement, Table, Update, bindparam, case, insert, null, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from corral.db.base import table_of
from corral.db.models import Attempt, Gpu, Job, JobEvent, Node
from corral.scheduler.types import NodeState
from corral.services.notify_outbox import notify_event, queue_notifications
from corral.services.states import (
    ATTEMPT_TRANSITIONS,
    GPU_TRANSITIONS,
    NODE_TRANSITIONS,
    TERMINAL_STATES,
    AttemptState,
    GpuHealth,
    InvalidTransition,
    JobState,
    can_transition,
)
from corral.words import plural

DEFAULT_LOST_REQUEUE_BUDGET = 3  # Settings.lost_requeue_budget (CORRAL_LOST_REQUEUE_BUDGET)


JOBS = table_of(Job)
ATTEMPTS = table_of(Attempt)
NODES = table_of(Node)
GPUS = table_of(Gpu)


# SQL edge: SQLAlchemy's `Table` carries an explicit Any in its own annotations, so the two
# functions that take one are the module's only `--disallow-any-explicit` findings.
@functools.cache
def _cas_statement(
    table: Table,
    keys: tuple[str, ...],
    column: str,
    columns: tuple[str, ...],
    not_cancelled: bool,
    keep_cancel_reason: bool = False,
) -> Update:
    """One compiled-once UPDATE per (table, columns written) with every value a bound parameter:
    the loops run it for each job of a batch, and building and caching a new statement each time
    cost more than the write itself. `keep_cancel_reason`: the `reason` is written only where no
    cancel was requested, as the row reads at the UPDATE (not the caller's copy)."""
    stmt = update(table).where(
        *(table.c[k] == bindparam(f"key_{k}") for k in keys), table.c[column] == bindparam("expected")
    )
    if not_cancelled:
        stmt = stmt.where(~table.c.cancel_requested)
    values: dict[str, ColumnElement[object]] = {c: bindparam(f"new_{c}") for c in columns}
    if keep_cancel_reason and "reason" in values:
        values["reason"] = case((table.c.cancel_requested, table.c.reason), else_=values["reason"])
    return stmt.values(values)


def _compare_and_set(
    session: Session,
    obj: Job | Attempt | Node | Gpu,
    table: Table,
    keys: Mapping[str, object],
    column: str,
    expected: str,
    values: Mapping[str, object],
    not_cancelled: bool = False,
    keep_cancel_reason: bool = False,
) -> bool:
    """The one UPDATE ... WHERE key AND <column> = :expected. True when the row was written."""
    stmt = _cas_statement(table, tuple(keys), column, tuple(values), not_cancelled, keep_cancel_reason)
    params = {"expected": expected, **{f"key_{k}": v for k, v in keys.items()}}
    params.update({f"new_{c}": v for c, v in values.items()})
    won = session.connection().execute(stmt, params).rowcount == 1
    if won:
        for name, value in values.items():
            set_committed_value(obj, name, value)
        if keep_cancel_reason and "reason" in values:  # the row decided which reason stands
            session.expire(obj, ["reason", "cancel_requested"])
    else:
        session.expire(obj, [column])
    return won


# -- jobs ----------------------------------------------------------------------------------------


def transition(
    session: Session,
    job: Job,
    target: JobState,
    *,
    now: float,
    message: str = "",
    values: Mapping[str, object] | None = None,
    not_cancelled: bool = False,
) -> bool:
    """Move `job` from the state its copy shows to `target` (compare-and-set), with `values` (other
    columns of the job written in the same UPDATE) and a JobEvent. False: the row was no longer in
    that state (or, with `not_cancelled`, a cancel was requested); nothing was written. Raises
    InvalidTransition when the table does not allow the move: a programming error, rolled back by
    the caller."""
    current = JobState(job.state)
    if not can_transition(current, target):
        raise InvalidTransition(job.id, current.value, target.value)
    columns: dict[str, object] = {"state": target.value, "updated_at": now, **(values or {})}
    if target.terminal:
        columns["finished_at"] = now
        columns.update(_no_diagnosis(job))
    preempted = target is JobState.PREEMPTED and bool(message)
    if message and (target.terminal or (preempted and not job.cancel_requested)):
        # why it is being preempted: the requeue repeats it (not over a cancel's words, which its
        # CANCELLED end repeats: `cancelled_message`; nor over those of a cancel committed since
        # this copy was read: the UPDATE itself looks)
        columns["reason"] = message
    keys = {"id": job.id}
    if not _compare_and_set(
        session, job, JOBS, keys, "state", current.value, columns, not_cancelled, keep_cancel_reason=preempted
    ):
        return False
    record_event(session, job.id, now, message, from_state=current.value, to_state=target.value)
    queue_notifications(session, [job], current, target, now=now, messages={job.id: message})
    return True


def _no_diagnosis(job: Job) -> dict[str, object]:
    """Clear a waiting job's "why pending" only when it has one: a JSON column written with None
    stores JSON `null`, which the ORM (which writes only changes) never did for an empty one."""
    return {} if job.diagnosis is None else {"diagnosis": None}


# Built once: the schedule loop runs it for every batch it places.
SCHEDULE_BATCH = (
    update(JOBS)
    .where(
        JOBS.c.id.in_(bindparam("ids", expanding=True)),
        JOBS.c.state == JobState.QUEUED.value,
        ~JOBS.c.cancel_requested,
        JOBS.c.held_by.is_(None),  # a hold committed since the snapshot wins: the job stays queued
    )
    .values(
        state=JobState.SCHEDULED.value,
        updated_at=bindparam("now"),
        attempt_count=JOBS.c.attempt_count + 1,
        diagnosis=null(),  # SQL NULL, as a job that never had a diagnosis holds
    )
    .returning(JOBS.c.id, JOBS.c.attempt_count)
)


def schedule_jobs(
    session: Session,
    jobs: Sequence[Job],
    *,
    now: float,
    messages: Mapping[int, str],
) -> dict[int, int]:
    """QUEUED -> SCHEDULED for a batch (one job or many) by one compare-and-set UPDATE ... RETURNING for
    all of them (each row only while still QUEUED, not held, with no cancel requested), then one INSERT of
    their events. Returns {job id: its new attempt count} for the rows written (the caller adds
    attempt number that count); the others lost their race, nothing of theirs was written."""
    for job in jobs:
        if job.state != JobState.QUEUED.value:
            raise InvalidTransition(job.id, job.state, JobState.SCHEDULED.value)
    if not jobs:
        return {}
    connection = session.connection()
    won = {
        int(row[0]): int(row[1])
        for row in connection.execute(SCHEDULE_BATCH, {"ids": [j.id for j in jobs], "now": now})
    }
    events = []
    for job in jobs:
        if job.id not in won:
            session.expire(job, ["state"])
            continue
        for name, value in (
            ("state", JobState.SCHEDULED.value),
            ("updated_at", now),
            ("attempt_count", won[job.id]),
            ("diagnosis", None),
        ):
            set_committed_value(job, name, value)
        events.append(
            {
                "job_id": job.id,
                "at": now,
                "kind": "transition",
                "from_state": JobState.QUEUED.value,
                "to_state": JobState.SCHEDULED.value,
                "message": messages.get(job.id, ""),
            }
        )
    if events:
        connection.execute(INSERT_EVENT, events)
    return won


class Loss(StrEnum):
    """What was lost. All four share one requeue budget per job (`settle_lost_work`)."""

    ATTEMPT = "attempt lost"  # the engine no longer knows the attempt
    SUPERVISOR = "supervisor lost"  # the process that watched the attempt died
    NODE = "node lost"  # the node stopped sending heartbeats or was reported down
    ENGINE = "engine lost"  # the engine (e.g. Slurm) lost its record of the job


def settle_lost_work(
    session: Session, job: Job, *, loss: Loss, why: str, now: float, budget: int = DEFAULT_LOST_REQUEUE_BUDGET
) -> JobState | None:
    """THE rule for lost work, whatever was lost: a cancelled job is cancelled, a preempted one
    goes back to the queue (it was being stopped anyway), any other is requeued while its
    platform losses stay within `budget` (losses are not the job's fault and do not use up
    `retries:`), else FAILED. Returns the state entered, None after a lost race."""
    if job.cancel_requested:  # who or what asked, as the other CANCELLED ends say it
        target, message, values = JobState.CANCELLED, f"{cancelled_message(job)}; {loss.value}: {why}", {}
    elif job.state == JobState.PREEMPTED.value:  # what preempted it, as rule 3's requeue says it
        message = f"{job.reason or 'preempted'}; {loss.value} ({why}); back in the queue"
        target = JobState.QUEUED
        values = {"preemptions": job.preemptions + 1, "reason": message}
    else:
        losses = job.platform_losses + 1
        if losses <= budget:
            target = JobState.QUEUED
            message = f"{loss.value}: {why}; requeued (platform loss {losses} of {budget})"
        else:
            target = JobState.FAILED
            lost = plural(losses, "time")
            message = f"{loss.value}: {why}; lost {lost}, over the platform-loss budget of {budget}"
        values = {"platform_losses": losses, "reason": message}
    return target if transition(session, job, target, now=now, message=message, values=values) else None


@dataclass(frozen=True, slots=True)
class RetryRule:
    """The exit-spec's verdict on one failure, as the retry rules read it."""

    own_fault: bool  # True: counts against `retries:`; False: against the platform-loss budget
    cap: int | None = None  # at most this many retries for it (0: never; None: the budget decides)
    label: str = ""  # "user_error", ... for the reason text


def settle_failure(
    session: Session,
    job: Job,
    *,
    why: str,
    now: float,
    retryable: bool | None = None,
    rule: RetryRule | None = None,
    budget: int = DEFAULT_LOST_REQUEUE_BUDGET,
) -> JobState | None:
    """The job's failure: FAILED, or QUEUED while its own failures <= `retries:`.
    `retryable`: the exit-spec's verdict on this failure when there is one (False: never retried,
    True or None: the retry budget decides). `rule` (the exit-spec's category and retry policy)
    refines it: a failure that is not the job's fault (platform, hardware, transient) is requeued
    on the platform-loss `budget` and never uses up `retries:`; `cap` bounds either count.
    Returns the state entered, None after a lost race."""
    if job.cancel_requested:
        message = f"{cancelled_message(job)}; {why}"  # who or what asked, as the other ends say it
        done = transition(session, job, JobState.CANCELLED, now=now, message=message)
        return JobState.CANCELLED if done else None
    values: dict[str, object]
    if rule is not None and not rule.own_fault:
        losses = job.platform_losses + 1
        cap = budget if rule.cap is None else min(rule.cap, budget)
        if losses <= cap:
            target, message = JobState.QUEUED, f"{why}; requeued (platform loss {losses} of {cap})"
        elif rule.cap == 0:
            target, message = JobState.FAILED, f"{why} (not retryable: {rule.label})"
        else:
            target, message = (
                JobState.FAILED,
                f"{why}; failed {plural(losses, 'time')}, over the limit of {cap}",
            )
        values = {"platform_losses": losses, "reason": message}
        return target if transition(session, job, target, now=now, message=message, values=values) else None
    failures = job.own_failures + 1
    cap = job.max_retries if rule is None or rule.cap is None else min(rule.cap, job.max_retries)
    if rule is not None and rule.cap == 0:
        retryable = False
    if retryable is not False and failures <= cap:
        target, message = JobState.QUEUED, f"{why} (retrying: retry {failures} of {cap})"
    elif retryable is False:
        label = f": {rule.label}" if rule is not None and rule.label else ""
        target, message = JobState.FAILED, f"{why} (not retryable{label})"
    else:
        target, message = JobState.FAILED, why
    values = {"own_failures": failures, "reason": message}
    return target if transition(session, job, target, now=now, message=message, values=values) else None


class Ending(StrEnum):
    """How the engine says an attempt ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    ending: Ending
    why: str  # human text: "exit code 3", "node_lost: ..."
    finished_at: float | None = None  # when the engine saw it end (None: unknown)
    loss: Loss = Loss.ATTEMPT  # what was lost, for Ending.LOST
    retryable: bool | None = None  # the exit-spec's verdict, for Ending.FAILED
    rule: RetryRule | None = None  # the exit-spec's category and retry cap, for Ending.FAILED


def succeeded_before_stop(attempt: Attempt, end: AttemptEnd) -> bool:
    """Rule 1: an exit 0 before Corral asked the attempt to stop settles its job SUCCEEDED,
    whatever cancel or preemption is pending (the reconcile loop settles these as a batch)."""
    stop_at = attempt.stop_requested_at
    before_stop = stop_at is None or (end.finished_at is not None and end.finished_at < stop_at)
    return end.ending is Ending.SUCCEEDED and before_stop


def success_values(job: Job) -> dict[str, object]:
    """Rule 1's columns besides the state: a preempted job's reason is its preemption's (written
    when it was preempted, for `corral show`); one whose work ended before the stop says so."""
    if job.state == JobState.PREEMPTED.value:
        return {"reason": "its work ended (exit 0) before the preemption stopped it"}
    return {}


def settle_attempt_end(
    session: Session,
    job: Job,
    attempt: Attempt,
    end: AttemptEnd,
    *,
    now: float,
    budget: int = DEFAULT_LOST_REQUEUE_BUDGET,
) -> AttemptState | None:
    """Settle the job of an attempt that ended (the rules in this module's docstring) and return
    the state the attempt must end in (`end_attempt`); None: the job changed meanwhile, nothing
    was written and the next look at the attempt decides again."""
    if succeeded_before_stop(attempt, end):
        done = transition(session, job, JobState.SUCCEEDED, now=now, values=success_values(job))
        return AttemptState.SUCCEEDED if done else None
    if job.cancel_requested:
        done = transition(session, job, JobState.CANCELLED, now=now, message=cancelled_message(job))
        return AttemptState.CANCELLED if done else None
    if job.state == JobState.PREEMPTED.value:
        # The preemption wrote why ("reclaimed by group nlp for job 14: ..."); say it again here,
        # since it is the job's reason from now on (`corral show`) and the one line users read.
        message = f"{job.reason or 'preempted'}; back in the queue"
        values = {"preemptions": job.preemptions + 1, "reason": message}
        done = transition(session, job, JobState.QUEUED, now=now, message=message, values=values)
        return AttemptState.PREEMPTED if done else None
    if end.ending is Ending.SUCCEEDED:
        return AttemptState.SUCCEEDED if transition(session, job, JobState.SUCCEEDED, now=now) else None
    if end.ending is Ending.LOST:
        why = f"attempt {attempt.number} ({end.why})"
        entered = settle_lost_work(session, job, loss=end.loss, why=why, now=now, budget=budget)
        return AttemptState.LOST if entered is not None else None
    why = f"attempt {attempt.number} failed ({end.why})"
    entered = settle_failure(
        session, job, why=why, now=now, retryable=end.retryable, rule=end.rule, budget=budget
    )
    return AttemptState.FAILED if entered is not None else None


# -- attempts, nodes, GPUs -----------------------------------------------------------------------


def move_attempt(
    session: Session, attempt: Attempt, target: AttemptState, values: Mapping[str, object] | None = None
) -> bool:
    """Compare-and-set of `attempt` from the state its copy shows to `target` (with `values`)."""
    current = AttemptState(attempt.state)
    if target not in ATTEMPT_TRANSITIONS[current]:
        raise InvalidTransition(attempt.attempt_id, current.value, target.value, "attempt")
    columns = {"state": target.value, **(values or {})}
    return _compare_and_set(session, attempt, ATTEMPTS, {"id": attempt.id}, "state", current.value, columns)


# The engine's words on an attempt it holds before starting it, written only while it starts: an
# attempt that started or ended meanwhile keeps what its move wrote.
NOTE_WAITING = (
    update(ATTEMPTS)
    .where(
        ATTEMPTS.c.job_id == bindparam("b_job_id"),
        ATTEMPTS.c.number == bindparam("b_number"),
        ATTEMPTS.c.state == AttemptState.STARTING.value,
    )
    .values(message=bindparam("b_text"))
)


def note_attempts_waiting(session: Session, messages: Mapping[str, str]) -> None:
    """{attempt id "job.number": why the engine has not started it yet} on those attempts still
    STARTING (not a state change: their state is untouched; RUNNING clears the message)."""
    rows = []
    for attempt_id, text in messages.items():
        job_id, _, number = attempt_id.partition(".")
        rows.append({"b_job_id": int(job_id), "b_number": int(number), "b_text": text})
    if rows:
        session.connection().execute(NOTE_WAITING, rows)


def move_node(session: Session, node: Node, target: NodeState, *, message: str | None = None) -> bool:
    """Compare-and-set of `node`'s effective state (and message). A node already in `target` is
    left as it is (True, no write): the node loop recomputes every node's state every tick."""
    values: dict[str, str] = {} if message is None or message == node.message else {"message": message}
    if node.state == target.value:
        if values:  # same state, new text: a plain column, not guarded
            node.message = values["message"]
        return True
    current = NodeState(node.state) if node.state in NodeState._value2member_map_ else NodeState.UNKNOWN
    if target not in NODE_TRANSITIONS[current]:
        raise InvalidTransition(node.name, current.value, target.value, "node")
    columns = {"state": target.value, **values}
    return _compare_and_set(session, node, NODES, {"name": node.name}, "state", node.state, columns)


def move_gpu(session: Session, gpu: Gpu, target: GpuHealth) -> bool:
    """Compare-and-set of a GPU's health (quarantine, loss, return to service)."""
    current = GpuHealth(gpu.health)
    if target not in GPU_TRANSITIONS[current]:
        raise InvalidTransition(f"{gpu.node_name}/{gpu.index}", current.value, target.value, "GPU")
    keys = {"node_name": gpu.node_name, "index": gpu.index}
    return _compare_and_set(session, gpu, GPUS, keys, "health", current.value, {"health": target.value})


# -- batches: one compare-and-set for every row that moves the same way --------------------------


# How one column of a batch is written: the same value for every row ("same"), SQL NULL for every
# row ("null": a JSON column bound with None would store JSON `null`), or each row its own
# ("rows": CASE WHEN id = :id_<column>_0 THEN :new_<column>_0 ... ELSE <column> END).
ColumnWrite = tuple[str, str]


@functools.lru_cache(maxsize=512)
def _batch_statement(table: Table, writes: tuple[ColumnWrite, ...], size: int) -> Update:
    """The batch's UPDATE ... RETURNING id, built once per (table, columns, how each is written,
    batch size) with every value a bound parameter, as `_cas_statement` is: building a statement
    with a hundred literals and its cache key cost more than running it."""
    assignments: dict[str, ColumnElement[object]] = {}
    for name, how in writes:
        column = table.c[name]
        if how == "null":
            assignments[name] = cast("ColumnElement[object]", null())
        elif how == "same":
            assignments[name] = bindparam(f"new_{name}", type_=column.type)
        else:
            whens = [
                (table.c.id == bindparam(f"id_{name}_{i}"), bindparam(f"new_{name}_{i}", type_=column.type))
                for i in range(size)
            ]
            assignments[name] = cast("ColumnElement[object]", case(*whens, else_=column))
    return (
        update(table)
        .where(table.c.id.in_(bindparam("ids", expanding=True)), table.c.state == bindparam("expected"))
        .values(assignments)
        .returning(table.c.id)
    )


# Rows per batch UPDATE: a per-row column is a CASE of one WHEN per row, which the database
# searches row by row (quadratic: 2,000 rows took 0.8 s in SQLite, holding its write lock), and
# PostgreSQL takes at most 65,535 bound parameters a statement; it also bounds the statement cache.
CAS_BATCH_ROWS = 256
RowT = TypeVar("RowT", Job, Attempt)


def _chunks_by_state(rows: Sequence[RowT]) -> Iterator[tuple[str, list[RowT]]]:
    """The rows grouped by the state their copies show, each group in chunks of at most
    CAS_BATCH_ROWS: one batch UPDATE each."""
    by_state: dict[str, list[RowT]] = {}
    for row in rows:
        by_state.setdefault(row.state, []).append(row)
    for state, group in by_state.items():
        for first in range(0, len(group), CAS_BATCH_ROWS):
            yield state, group[first : first + CAS_BATCH_ROWS]


def _cas_batch(
    session: Session,
    table: Table,
    rows: Sequence[Job] | Sequence[Attempt],
    expected: str,
    values: Mapping[int, Mapping[str, object]],
) -> set[int]:
    """UPDATE <table> SET ... WHERE id IN (...) AND state = :expected RETURNING id: the rows of one
    chunk (`_chunks_by_state`) that are all in `expected` and move the same way, with `values`
    {row id: columns}. Each row wins or loses on its own: a row changed by another session is not
    returned and nothing of it is written (its copy's state is expired); the winners get the
    written values as committed values, as `_compare_and_set` does."""
    ids = [row.id for row in rows]
    params: dict[str, object] = {"ids": ids, "expected": expected}
    writes: list[ColumnWrite] = []
    for name in sorted({name for row_values in values.values() for name in row_values}):
        named = [values[key][name] for key in ids if name in values[key]]
        if len(named) == len(ids) and all(value == named[0] for value in named):
            writes.append((name, "null" if named[0] is None else "same"))
            params[f"new_{name}"] = named[0]
            continue
        writes.append((name, "rows"))
        for i, key in enumerate(ids):
            # a row that does not name the column matches none of its WHENs (-1 is no row's id)
            params[f"id_{name}_{i}"] = key if name in values[key] else -1
            params[f"new_{name}_{i}"] = values[key].get(name)
    stmt = _batch_statement(table, tuple(writes), len(ids))
    won = {int(row[0]) for row in session.connection().execute(stmt, params)}
    for row in rows:
        if row.id in won:
            for name, value in values[row.id].items():
                set_committed_value(row, name, value)
        else:
            session.expire(row, ["state"])
    return won


def transition_jobs(
    session: Session,
    jobs: Sequence[Job],
    target: JobState,
    *,
    now: float,
    values: Mapping[int, Mapping[str, object]] | None = None,
) -> set[int]:
    """`transition` for a batch: every job from the state its copy shows to `target`, by one
    compare-and-set UPDATE ... RETURNING per state the copies show (one for a batch that all
    moved the same way), with `values` {job id: other columns} and one INSERT of the events of
    the jobs written. Returns the ids written; the others lost their race, nothing of theirs was
    written. Raises InvalidTransition as `transition` does, before any write."""
    for job in jobs:
        if not can_transition(JobState(job.state), target):
            raise InvalidTransition(job.id, job.state, target.value)
    won: set[int] = set()
    events = []
    for current, group in _chunks_by_state(jobs):
        columns: dict[int, dict[str, object]] = {}
        for job in group:
            columns[job.id] = {"state": target.value, "updated_at": now, **((values or {}).get(job.id, {}))}
            if target.terminal:
                # every row's, so that the batch writes SQL NULL (as the schedule's batch does): a
                # JSON column bound with None, for only some rows, would store JSON `null`
                columns[job.id].update({"finished_at": now, "diagnosis": None})
        moved = _cas_batch(session, JOBS, group, current, columns)
        won |= moved
        if moved and notify_event(JobState(current), target) is not None:
            reasons = {job_id: str(columns[job_id].get("reason", "")) for job_id in moved}
            moved_jobs = [job for job in group if job.id in moved]
            queue_notifications(session, moved_jobs, JobState(current), target, now=now, messages=reasons)
        events += [
            {
                "job_id": job_id,
                "at": now,
                "kind": "transition",
                "from_state": current,
                "to_state": target.value,
                "message": "",
            }
            for job_id in sorted(moved)
        ]
    if events:
        session.connection().execute(INSERT_EVENT, events)
    return won


def move_attempts(
    session: Session,
    attempts: Sequence[Attempt],
    target: AttemptState,
    values: Mapping[int, Mapping[str, object]] | None = None,
) -> set[int]:
    """`move_attempt` for a batch, by one compare-and-set per state the copies show, with
    `values` {attempt row id: other columns}; returns the row ids written."""
    for attempt in attempts:
        if target not in ATTEMPT_TRANSITIONS[AttemptState(attempt.state)]:
            raise InvalidTransition(attempt.attempt_id, attempt.state, target.value, "attempt")
    won: set[int] = set()
    for current, group in _chunks_by_state(attempts):
        columns = {a.id: {"state": target.value, **((values or {}).get(a.id, {}))} for a in group}
        won |= _cas_batch(session, ATTEMPTS, group, current, columns)
    return won


# -- holds ---------------------------------------------------------------------------------------

# A hold's write: only while the job is QUEUED and not held, as the row reads at the UPDATE. The
# schedule loop's own write (SCHEDULE_BATCH) moves only a job that is not held: whichever commits
# first wins, and the other matches no row. Its stale "why pending" goes (it is held instead).
HOLD_QUEUED = (
    update(JOBS)
    .where(JOBS.c.id == bindparam("job_id"), JOBS.c.state == JobState.QUEUED.value, JOBS.c.held_by.is_(None))
    .values(
        held_by=bindparam("holder"),
        held_at=bindparam("now"),
        held_as_admin=bindparam("as_admin"),
        updated_at=bindparam("now"),
        diagnosis=null(),
        # The estimate shown before the hold is forgotten: the hold's time is no part of the wait it
        # predicted, so after the release the job is measured from its next first estimate (eta_record).
        eta_shown_at=null(),
        eta_shown_wait_s=null(),
    )
)
# A release's write: only the hold the caller's copy shows (its held_at), while still queued.
RELEASE_HELD = (
    update(JOBS)
    .where(
        JOBS.c.id == bindparam("job_id"),
        JOBS.c.state == JobState.QUEUED.value,
        JOBS.c.held_by.is_not(None),
        JOBS.c.held_at == bindparam("expected_held_at"),
    )
    .values(held_by=None, held_at=None, held_as_admin=False, updated_at=bindparam("now"))
)
HOLD_COLUMNS = ("state", "held_by", "held_at", "held_as_admin")


def hold(session: Session, job: Job, *, user_id: int, as_admin: bool, now: float, message: str) -> bool:
    """Hold a QUEUED job back from the scheduler by compare-and-set on (state = QUEUED, not held),
    with a "hold" event saying `message`. False (nothing written, the copy's state and hold
    expired so that they are read again): the job was placed or ended meanwhile, or someone else
    held it first. `as_admin`: an admin's hold, which only an admin releases."""
    params = {"job_id": job.id, "holder": user_id, "as_admin": as_admin, "now": now}
    if session.connection().execute(HOLD_QUEUED, params).rowcount != 1:
        session.expire(job, list(HOLD_COLUMNS))
        return False
    for name, value in {
        "held_by": user_id,
        "held_at": now,
        "held_as_admin": as_admin,
        "updated_at": now,
    }.items():
        set_committed_value(job, name, value)
    for name in ("diagnosis", "eta_shown_at", "eta_shown_wait_s"):
        set_committed_value(job, name, None)
    record_event(session, job.id, now, message, kind="hold", from_state=job.state, to_state=job.state)
    return True


def release(session: Session, job: Job, *, now: float, message: str) -> bool:
    """Release the hold the copy of `job` shows, by compare-and-set on (state = QUEUED, that hold),
    with a "release" event. False (nothing written, the copy expired): it changed meanwhile."""
    params = {"job_id": job.id, "expected_held_at": job.held_at, "now": now}
    if job.held_by is None or session.connection().execute(RELEASE_HELD, params).rowcount != 1:
        session.expire(job, list(HOLD_COLUMNS))
        return False
    for name, value in (("held_by", None), ("held_at", None), ("held_as_admin", False), ("updated_at", now)):
        set_committed_value(job, name, value)
    record_event(session, job.id, now, message, kind="release", from_state=job.state, to_state=job.state)
    return True


# -- events --------------------------------------------------------------------------------------

INSERT_EVENT = insert(table_of(JobEvent))


# The cancel request's write: only while the job has not ended, as the row reads at the UPDATE.
REQUEST_CANCEL = (
    update(JOBS)
    .where(
        JOBS.c.id == bindparam("job_id"),
        JOBS.c.state.notin_([state.value for state in TERMINAL_STATES]),
    )
    .values(cancel_requested=True, updated_at=bindparam("now"), reason=bindparam("why"))
)


def request_cancel(
    session: Session, job: Job, *, now: float, why: str, kind: str = "cancel_requested"
) -> bool:
    """Ask the control loops to stop an active `job` (`cancel_requested`; they settle it CANCELLED):
    `why` ("cancel requested by alice", "stopped by rule ...") is its event and its reason from
    now on, which the CANCELLED end repeats, so `corral show` says who or what stopped it. False
    (nothing written) when the job ended since the caller's copy was read: its own reason stands."""
    params = {"job_id": job.id, "now": now, "why": why}
    if session.connection().execute(REQUEST_CANCEL, params).rowcount != 1:
        session.expire(job, ["state"])
        return False
    for name, value in (("cancel_requested", True), ("updated_at", now), ("reason", why)):
        set_committed_value(job, name, value)
    record_event(session, job.id, now, why, kind=kind, from_state=job.state)
    return True


def cancelled_message(job: Job) -> str:
    """The CANCELLED end of a job whose cancel was requested: the request's words."""
    return job.reason if job.cancel_requested and job.reason else "cancelled by request"


def record_event(
    session: Session,
    job_id: int,
    now: float,
    message: str,
    *,
    kind: str = "transition",
    from_state: str | None = None,
    to_state: str | None = None,
    immediate: bool = False,
) -> None:
    """Add one entry to the job's event history (shown by `corral show`, the API and the portal),
    written at the session's next flush, with the job's own changes.

    `immediate`: one INSERT executed now instead, for a job row already written. Only for short
    write transactions (submit): on SQLite it takes the write lock at once, and the control loops,
    which call the engine before they commit, must not hold it that long."""
    columns = {
        "job_id": job_id,
        "at": now,
        "kind": kind,
        "from_state": from_state,
        "to_state": to_state,
        "message": message,
    }
    if immediate:
        session.connection().execute(INSERT_EVENT, columns)
    else:
        session.add(JobEvent(**columns))
