"""Job notifications: a job's owner hears when it starts, ends or is requeued, as its spec's
`notify` asks (corral.spec.NotifyV1), at their own contacts (their account's email and
`corral oncall contact add`).

How a notification travels (docs/operations.md, "Job notifications"):

1. The compare-and-set that moves the job (corral.services.lifecycle, with
   corral.services.notify_outbox.queue_notifications) inserts a `JobNotification` outbox row in
   its own transaction: a crash after the commit loses nothing, a lost race or a retried
   transition writes nothing twice, and the transition reads and sends nothing more than before.
2. The notification loop (corral.monitor.job_notifier) groups each user's pending rows
   (`group_pending`, one user per transaction, the rows moved by compare-and-set so that two
   servers' passes never both take them) into one message per contact, and sends it with the
   paging loop's transports and retry policy (SMTP through the monitor config's email channel;
   webhooks guarded against SSRF by corral.services.webhook_guard).
3. The rate rule: at most one message per user every DIGEST_WINDOW_S (60 s). The first event goes
   out at once; the events of the next minute wait for its end and go together as one digest
   ("12 job notifications: 10 failed, 2 succeeded"), so a failing array of 500 trials sends a
   handful of messages, not 500. All of a due user's waiting rows go in that digest (the first
   DIGEST_MAX_LINES listed, the rest counted), so a flood is caught up at once.
4. Each message ends `sent` or, after the retry policy's attempts, `given_up`; either outcome is
   a `notify` event on every job it told of (`corral show`), and `notifications_of` (GET
   /api/v1/jobs/{id}/notifications) says where each went and how its delivery stands. A settled
   message keeps no text (a failure's log tail goes with it); a deleted job's messages are
   purged (`purge_settled`). A message whose address its owner removed or changed since it was
   grouped is given up unsent (corral.services.oncall.no_longer_reaches), not re-addressed.

A user's default (`set_default`, `with_default`): the `notify` their jobs submitted without one
get, written into the stored spec at submit (the lifecycle reads only the job's own spec).

A failure's message carries the diagnosis (reason and fix) and the last lines of its log
(bounded: LOG_TAIL_LINES lines, LOG_TAIL_CHARS characters); it only ever goes to the job owner's
own contacts, which the spec can narrow by kind (`to`) but never add to.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from corral.db.diag_models import AttemptDiagnosis
from corral.db.models import Attempt, Job, User
from corral.db.notify_models import JobNotification, JobNotifyDefault, JobNotifyDelivery
from corral.services import audit
from corral.services.accounts import user_by_name
from corral.services.auth import Principal
from corral.services.errors import Forbidden, Invalid
from corral.services.lifecycle import record_event
from corral.services.oncall import addresses_of, shown_url
from corral.spec import NOTIFY_EVENTS, JobSpecV1, NotifyV1, format_seconds
from corral.words import plural

log = logging.getLogger(__name__)
DIGEST_WINDOW_S = 60.0  # at most one message per user per window; later events wait, then go as one
GROUP_USERS = 200  # due users grouped per pass; each catches up on all their pending rows at once
DIGEST_MAX_LINES = 50  # a digest lists (and its webhook JSON carries) this many events, then counts the rest
IDS_PER_QUERY = 5000  # ids bound into one IN (...): SQLite and PostgreSQL cap a statement's parameters
LOG_TAIL_LINES = 20
LOG_TAIL_CHARS = 2000
SETTLED = ("sent", "given_up")
LogTail = Callable[[Job], str]  # the last lines of a failed job's log ("" when there are none)


def _no_log_tail(job: Job) -> str:
    return ""


class Pending(NamedTuple):
    """One pending outbox row, as grouping reads it (a plain row: a flood of them stays cheap)."""

    id: int
    job_id: int
    event: str
    attempt: int
    at: float
    message: str


# C0 controls but tab, newline and carriage return, and DEL: PostgreSQL refuses a NUL in a text or
# JSON value (one such row failed every pass), and the others only garble a mail or a terminal.
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def storable(text: str) -> str:
    """`text` with control characters (NUL first of all) replaced by U+FFFD, safe to store."""
    return _CONTROLS.sub("\ufffd", text)


def _chunks(ids: Sequence[int]) -> Iterator[Sequence[int]]:
    for start in range(0, len(ids), IDS_PER_QUERY):
        yield ids[start : start + IDS_PER_QUERY]


# --- what a message says -------------------------------------------------------------------------


def _runtime_s(attempts: Sequence[Attempt], now: float) -> float:
    return sum(max(0.0, (a.ended_at or now) - a.started_at) for a in attempts if a.started_at is not None)


def _diagnosis(session: Session, job_id: int) -> dict[str, str] | None:
    found = session.scalar(
        select(AttemptDiagnosis).where(AttemptDiagnosis.job_id == job_id).order_by(AttemptDiagnosis.at.desc())
    )
    if found is None:
        return None
    return {"reason": found.reason, "category": found.category, "message": found.message, "fix": found.fix}


def _bounded_tail(text: str) -> str:
    lines = storable(text).rstrip("\n").splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(lines)[-LOG_TAIL_CHARS:]


def describe(session: Session, event: Pending, job: Job, base_url: str, now: float) -> dict[str, Any]:
    """One event as a message tells it (the webhook's JSON item; the email's text is made of it).
    Its reason is the transition's own words, stored with the outbox row when it happened (a
    start has none), never the job's reason now, which may be a later failure's."""
    attempts = list(job.attempts)
    item: dict[str, Any] = {
        "job_id": job.id, "name": job.name, "event": event.event, "state": job.state, "at": event.at,
        "attempt": event.attempt, "reason": storable(event.message),
        "runtime_s": round(_runtime_s(attempts, now), 1),
        "gpu_hours": round(job.attained_gpu_seconds / 3600.0, 3), "url": f"{base_url}/jobs/{job.id}",
        "diagnosis": _diagnosis(session, job.id) if event.event in ("failed", "requeued") else None,
    }  # fmt: skip
    return item


def _summary(item: dict[str, Any]) -> str:
    return f"job {item['job_id']} {item['name']} {item['event']}"


def _detail_lines(item: dict[str, Any]) -> list[str]:
    lines = [f"Job {item['job_id']} ({item['name']}) {item['event']}; it is {item['state']} now."]
    if item["reason"]:
        lines.append(f"Reason: {item['reason']}")
    diagnosis = item["diagnosis"]
    if diagnosis is not None:
        lines.append(f"Diagnosis: {diagnosis['reason']} ({diagnosis['category']}): {diagnosis['message']}")
        lines.append(f"Fix: {diagnosis['fix']}")
    lines.append(f"Runtime: {format_seconds(item['runtime_s'])}; GPU-hours: {item['gpu_hours']}")
    lines.append(f"Job: {item['url']}")
    if item.get("log_tail"):
        lines += ["", f"Last lines of its log (at most {LOG_TAIL_LINES}):", item["log_tail"]]
    return lines


@dataclass(frozen=True)
class Message:
    subject: str
    body: str
    payload: dict[str, Any]


def compose(user: str, items: Sequence[dict[str, Any]], counts: Mapping[str, int] | None = None) -> Message:
    """One message telling `items` (one event: all of it; several: a digest of one line each).
    `counts` (event -> how many): all the events it tells of, of which `items` are the first
    DIGEST_MAX_LINES or fewer (default: just `items`); the rest are counted, not listed, in the
    text and in the webhook's JSON (`count`, `omitted`), however many there are."""
    counts = Counter(i["event"] for i in items) if counts is None else counts
    total = sum(counts.values())
    listed = list(items[:DIGEST_MAX_LINES])
    if total == 1:
        subject = f"[Corral] {_summary(listed[0])}"
        body = "\n".join(_detail_lines(listed[0]))
    else:
        what = ", ".join(f"{counts[e]} {e}" for e in NOTIFY_EVENTS if counts.get(e))
        subject = f"[Corral] {plural(total, 'job notification')}: {what}"
        lines = [
            f"{plural(total, 'job event')} since the last message ({what}); one message per minute at most:",
            "",
        ]
        for item in listed:
            reason = f": {item['reason']}" if item["reason"] else ""
            lines.append(f"- {_summary(item)}{reason} ({item['url']})")
        if total > len(listed):
            lines.append(f"... and {total - len(listed)} more (corral ls)")
        body = "\n".join(lines)
    payload = {
        "event": "job_notification", "user": user, "count": total, "omitted": total - len(listed),
        "notifications": listed,
    }  # fmt: skip
    return Message(subject[:300], body, payload)


# --- grouping the outbox into messages -----------------------------------------------------------


class _Taken(Exception):
    """Another pass (another server) grouped some of these rows first: this one writes nothing."""


def _last_message_at(session: Session, user_ids: set[int]) -> dict[int, float]:
    rows = session.execute(
        select(JobNotifyDelivery.user_id, func.max(JobNotifyDelivery.created_at))
        .where(JobNotifyDelivery.user_id.in_(user_ids))
        .group_by(JobNotifyDelivery.user_id)
    ).all()
    return {int(uid): float(at) for uid, at in rows}


def _wanted_kinds(job: Job) -> tuple[str, ...]:
    notify = job.spec.notify
    return () if notify is None else notify.to


def kinds_of_jobs(session: Session, job_ids: set[int]) -> dict[int, tuple[str, ...]]:
    """Each job's `notify.to` (the kinds of contact it asked for; empty: all)."""
    out: dict[int, tuple[str, ...]] = {}
    for chunk in _chunks(sorted(job_ids)):
        for job_id, spec in session.execute(select(Job.id, Job.spec).where(Job.id.in_(chunk))):
            out[int(job_id)] = () if spec.notify is None else spec.notify.to
    return out


def _reaches(kinds: tuple[str, ...], kind: str) -> bool:
    return not kinds or kind in kinds


def _pending_of(session: Session, user_id: int) -> list[Pending]:
    rows = session.execute(
        select(
            JobNotification.id, JobNotification.job_id, JobNotification.event, JobNotification.attempt,
            JobNotification.at, JobNotification.message,
        )
        .where(JobNotification.user_id == user_id, JobNotification.state == "pending")
        .order_by(JobNotification.id)
    )  # fmt: skip
    return [Pending(*row) for row in rows]


def _items_for(
    session: Session, events: Sequence[Pending], single: bool, base_url: str, log_tail: LogTail, now: float
) -> dict[int, dict[str, Any]]:
    """The listed events as messages tell them (a digest lists; a single failure shows its log)."""
    jobs = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_({e.job_id for e in events})))}
    items = {}
    for event in events:
        item = describe(session, event, jobs[event.job_id], base_url, now)
        if single and event.event == "failed":
            item["log_tail"] = _bounded_tail(log_tail(jobs[event.job_id]))
        items[event.id] = item
    return items


def _settle_rows(session: Session, ids: Sequence[int], state: str, digest_id: int | None) -> None:
    """Move pending outbox rows to `state`, by compare-and-set: raises _Taken when any of them was
    no longer pending (another pass's), so that the caller rolls back and sends nothing twice."""
    for chunk in _chunks(ids):
        moved = session.execute(
            update(JobNotification)
            .where(JobNotification.id.in_(chunk), JobNotification.state == "pending")
            .values(state=state, digest_id=digest_id)
            .execution_options(synchronize_session=False)
        )
        if moved.rowcount != len(chunk):  # type: ignore[attr-defined]
            raise _Taken


def _group_user(
    session: Session, user: User, events: Sequence[Pending], base_url: str, log_tail: LogTail, now: float
) -> None:
    """One user's pending events (all of them, however many): a message per contact (those of its
    kinds the jobs asked for), all sharing one digest id, listing the first DIGEST_MAX_LINES and
    counting the rest; events no contact of theirs may carry are `no_contact`. Reads (and log
    reads) first, then the writes, committed by the caller: no write lock across a log read."""
    kinds = kinds_of_jobs(session, {e.job_id for e in events})
    contacts = addresses_of(session, user.id)  # none for a deactivated account
    told = {kind: [e for e in events if _reaches(kinds[e.job_id], kind)] for kind, _ in contacts}
    listed = sorted({e for mine in told.values() for e in mine[:DIGEST_MAX_LINES]}, key=lambda e: e.id)
    items = _items_for(session, listed, len(events) == 1, base_url, log_tail, now)
    digest_id = events[0].id
    reached = {e.id for mine in told.values() for e in mine}
    _settle_rows(session, sorted(reached), "grouped", digest_id)
    _settle_rows(session, [e.id for e in events if e.id not in reached], "no_contact", None)
    for kind, address in contacts:
        mine = told[kind]
        if not mine:
            continue
        counts = Counter(e.event for e in mine)
        message = compose(user.name, [items[e.id] for e in mine[:DIGEST_MAX_LINES]], counts)
        session.add(
            JobNotifyDelivery(
                digest_id=digest_id, user_id=user.id, kind=kind, address=address, subject=message.subject,
                body=message.body, payload=message.payload, events=len(mine), state="pending", attempts=0,
                next_attempt_at=now, last_error="", created_at=now,
            )
        )  # fmt: skip
    why = f"{user.name}'s account is deactivated" if not user.active else f"{user.name} has no contact"
    for event in (e for e in events if e.id not in reached):
        wanted = kinds[event.job_id]
        of_kind = f" of kind {'/'.join(wanted)}" if wanted and user.active else ""
        record_event(session, event.job_id, now, f"no notification of {event.event!r} sent: {why}{of_kind}",
                     kind="notify")  # fmt: skip


def _set_aside(session: Session, user: User, events: Sequence[Pending], exc: Exception, now: float) -> None:
    """Rows that could not be grouped (an unexpected error): `failed`, each job told why, so that
    they are not read again on every pass; committed. Compare-and-set, as grouping is."""
    try:
        _settle_rows(session, [e.id for e in events], "failed", None)
        for event in events:
            what = f"no notification of {event.event!r} sent: it could not be prepared ({type(exc).__name__})"
            record_event(session, event.job_id, now, what, kind="notify")
        session.commit()
    except _Taken:
        session.rollback()


def group_user(session: Session, user_id: int, base_url: str, log_tail: LogTail, now: float) -> int:
    """Group one due user's pending rows in a transaction of their own; returns how many. One
    user's bad row (or a lost race with another server's pass) never holds back anyone else's."""
    user = session.get(User, user_id)
    events = _pending_of(session, user_id)
    if user is None or not events:
        return 0  # a deleted user's rows go with them (cascade)
    try:
        with session.no_autoflush:  # the writes are flushed together, after every read
            _group_user(session, user, events, base_url, log_tail, now)
        session.commit()
        return len(events)
    except _Taken:
        session.rollback()
        log.info("job notifications of user %s were grouped by another pass", user_id)
        return 0
    except OperationalError as exc:  # the database is away or busy: the rows stay pending
        session.rollback()
        log.warning("job notifications of user %s not grouped this pass: %s", user_id, exc)
        return 0
    except Exception as exc:
        session.rollback()
        log.exception("job notifications of user %s could not be grouped; set aside", user_id)
        _set_aside(session, user, events, exc, now)
        return 0


def group_pending(
    session: Session, now: float, *, base_url: str, log_tail: LogTail = _no_log_tail,
    window_s: float = DIGEST_WINDOW_S,
) -> int:  # fmt: skip
    """Turn pending outbox rows into messages, by the rate rule (module docstring, 3); commits,
    one user at a time. Returns how many rows were grouped (a user still inside their window
    keeps theirs pending). A due user's rows are grouped all at once, so a flood is caught up
    in one digest; at most GROUP_USERS users a pass (the others are due on the next)."""
    waiting = set(
        session.scalars(select(JobNotification.user_id).where(JobNotification.state == "pending").distinct())
    )
    last = _last_message_at(session, waiting)
    due_users = sorted(u for u in waiting if u not in last or now >= last[u] + window_s)
    session.commit()  # the reads' transaction ends here, before any log read
    return sum(group_user(session, user_id, base_url, log_tail, now) for user_id in due_users[:GROUP_USERS])


def record_outcome(session: Session, delivery: JobNotifyDelivery, now: float) -> None:
    """A message that settled (sent or given up): a `notify` event on every job it told of. The
    address is not named (job events are read by whoever may see the job), only its kind. Its
    text and log tail are no longer needed, and go (a job deleted later leaves none behind)."""
    if delivery.state == "sent":
        what = f"notification sent by {delivery.kind}"
    else:
        error = delivery.last_error.replace(delivery.address, f"({delivery.kind} address)")
        what = (
            f"notification by {delivery.kind} given up after {plural(delivery.attempts, 'attempt')}: {error}"
        )
    digest = f" (one message for {delivery.events} events)" if delivery.events > 1 else ""
    events = list(
        session.scalars(select(JobNotification).where(JobNotification.digest_id == delivery.digest_id))
    )
    kinds = kinds_of_jobs(session, {e.job_id for e in events})
    for event in (e for e in events if _reaches(kinds.get(e.job_id, ()), delivery.kind)):
        record_event(session, event.job_id, now, f"{event.event}: {what}{digest}", kind="notify")
    for column, value in settled_text(delivery.payload).items():
        setattr(delivery, column, value)


def settled_text(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a settled message keeps of its text, as column values: no body, and its webhook JSON
    without the items (reasons, diagnoses, a failure's log tail). The one rule for both ways a
    settled outcome is written: `record_outcome`, and the notification loop's fallback write when
    that commit fails (corral.monitor.job_notifier), so neither keeps a log line past its send."""
    return {"body": "", "payload": {k: v for k, v in payload.items() if k != "notifications"}}


def tells_of(delivery: JobNotifyDelivery, event: JobNotification, kinds: tuple[str, ...]) -> bool:
    """Whether the message tells of the event: it is of the event's digest, and of a kind of
    contact the event's job asked for (`kinds`: its `notify.to`; empty: all), as grouping chose."""
    return event.digest_id == delivery.digest_id and _reaches(kinds, delivery.kind)


def purge_settled(session: Session, before: float) -> int:
    """Delete settled deliveries made before `before` (their jobs' events keep the outcome), and
    any delivery not being sent right now whose jobs were all deleted meanwhile: nothing of a
    deleted job (its log tail, its reason) is kept or sent after it."""
    told_of = exists().where(JobNotification.digest_id == JobNotifyDelivery.digest_id)
    orphan = ~told_of & (JobNotifyDelivery.state != "sending")
    gone = session.execute(
        delete(JobNotifyDelivery).where(
            (JobNotifyDelivery.state.in_(SETTLED) & (JobNotifyDelivery.created_at < before)) | orphan
        )
    )
    session.commit()
    return int(gone.rowcount or 0)  # type: ignore[attr-defined]


# --- a user's default ---------------------------------------------------------------------------


def _may_set(principal: Principal, name: str) -> None:
    """Checked on the name asked for, before it is looked up (as the contact routes do): anyone
    else gets this 403 whether `name` is a user or not."""
    if principal.name != name and not principal.is_admin:
        raise Forbidden(f"only {name} and admins may see or change {name}'s job notification default")


def default_view(session: Session, principal: Principal, name: str) -> dict[str, Any]:
    """A user's default `notify` ({"notify": {"on", "to"}}, or {"notify": null}: none)."""
    _may_set(principal, name)
    row = session.get(JobNotifyDefault, user_by_name(session, name).id)
    return {"user": name, "notify": None if row is None else {"on": list(row.on), "to": list(row.to)}}


def set_default(session: Session, principal: Principal, name: str, notify: NotifyV1 | None) -> dict[str, Any]:
    """Set (or with None clear) the `notify` a user's jobs get when their spec has none; audited,
    committed. Only for jobs submitted from now on: a stored spec is never changed."""
    _may_set(principal, name)
    if notify is not None and not notify.on:
        # a default that hears nothing would make every job say it "opts out of its owner's
        # default" (review108 #10): no default is said by clearing it
        raise Invalid(
            "a default notify needs at least one event in 'on'; to have none, clear it", ("body", "on")
        )
    user = user_by_name(session, name)
    row = session.get(JobNotifyDefault, user.id)
    before = None if row is None else {"on": list(row.on), "to": list(row.to)}
    if notify is None:
        if row is not None:
            session.delete(row)
    elif row is None:
        session.add(
            JobNotifyDefault(user_id=user.id, on=list(notify.on), to=list(notify.to), updated_at=time.time())
        )
    else:
        row.on, row.to, row.updated_at = list(notify.on), list(notify.to), time.time()
    after = None if notify is None else {"on": list(notify.on), "to": list(notify.to)}
    audit.record(
        session, actor=principal, action="job_notify.default", target_kind="user", target_id=user.name,
        before=before, after=after,
    )  # fmt: skip
    session.commit()
    return {"user": name, "notify": after}


def with_default(session: Session, user_id: int, spec: JobSpecV1) -> JobSpecV1:
    """The spec a batch job is stored with: its own `notify`, else its submitter's default."""
    if spec.notify is not None or spec.kind is not None:
        return spec
    row = session.get(JobNotifyDefault, user_id)
    if row is None:
        return spec
    return spec.model_copy(update={"notify": NotifyV1.model_validate({"on": row.on, "to": row.to})})


# --- what the API shows --------------------------------------------------------------------------


def notifications_of(session: Session, principal: Principal, job: Job) -> list[dict[str, Any]]:
    """The job's notifications, oldest first: each event, its state and its message's deliveries.
    An address shows to the job's owner and admins only (a webhook's as scheme://host:port/...,
    its path being its credential); anyone else who may see the job reads the kind and the state."""
    shows_address = principal.is_admin or principal.user_id == job.user_id
    events = list(
        session.scalars(
            select(JobNotification).where(JobNotification.job_id == job.id).order_by(JobNotification.id)
        )
    )
    digests = {e.digest_id for e in events if e.digest_id is not None}
    deliveries: dict[int, list[JobNotifyDelivery]] = {}
    if digests:
        for d in session.scalars(
            select(JobNotifyDelivery)
            .where(JobNotifyDelivery.digest_id.in_(digests))
            .order_by(JobNotifyDelivery.id)
        ):
            deliveries.setdefault(d.digest_id, []).append(d)
    kinds = _wanted_kinds(job)
    return [
        {
            "event": e.event, "at": e.at, "attempt": e.attempt, "state": e.state, "message": e.message,
            "deliveries": [
                _delivery_view(d, shows_address)
                for d in deliveries.get(e.digest_id or 0, [])
                if tells_of(d, e, kinds)
            ],
        }
        for e in events
    ]  # fmt: skip


def _delivery_view(d: JobNotifyDelivery, shows_address: bool) -> dict[str, Any]:
    address: str | None = d.address if d.kind == "email" else shown_url(d.address)
    error = d.last_error.replace(d.address, address or "")
    if not shows_address:
        address, error = None, d.last_error.replace(d.address, f"({d.kind} address hidden)")
    return {
        "kind": d.kind, "address": address, "state": d.state, "attempts": d.attempts, "sent_at": d.sent_at,
        "last_error": error, "events": d.events, "subject": d.subject,
    }  # fmt: skip
