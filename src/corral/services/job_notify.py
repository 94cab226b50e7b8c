"""Job notifications: a job's owner hears when it starts, ends or is requeued, as its spec's
`notify` asks (corral.spec.NotifyV1), at their own contacts (their account's email and
`corral oncall contact add`).

How a notification travels (docs/operations.md, "Job notifications"):

1. The compare-and-set that moves the job (corral.services.lifecycle, with
   corral.services.notify_outbox.queue_notifications) inserts a `JobNotification` outbox row in
   its own transaction: a crash after the commit loses nothing, a lost race or a retried
   transition writes nothing twice, and the transition reads and sends nothing more than before.
2. The notification loop (corral.monitor.job_notifier, a leased singleton) groups each user's
   pending rows (`group_pending`) into one message per contact, and sends it with the paging
   loop's transports and retry policy (SMTP through the monitor config's email channel; webhooks
   guarded against SSRF by corral.services.webhook_guard).
3. The rate rule: at most one message per user every DIGEST_WINDOW_S (60 s). The first event goes
   out at once; the events of the next minute wait for its end and go together as one digest
   ("12 job notifications: 10 failed, 2 succeeded"), so a failing array of 500 trials sends a
   handful of messages, not 500.
4. Each message ends `sent` or, after the retry policy's attempts, `given_up`; either outcome is
   a `notify` event on every job it told of (`corral show`), and `notifications_of` (GET
   /api/v1/jobs/{id}/notifications) says where each went and how its delivery stands.

A user's default (`set_default`, `with_default`): the `notify` their jobs submitted without one
get, written into the stored spec at submit (the lifecycle reads only the job's own spec).

A failure's message carries the diagnosis (reason and fix) and the last lines of its log
(bounded: LOG_TAIL_LINES lines, LOG_TAIL_CHARS characters); it only ever goes to the job owner's
own contacts, which the spec can narrow by kind (`to`) but never add to.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from corral.db.diag_models import AttemptDiagnosis
from corral.db.models import Attempt, Job, User
from corral.db.notify_models import JobNotification, JobNotifyDefault, JobNotifyDelivery
from corral.services import audit
from corral.services.accounts import user_by_name
from corral.services.auth import Principal
from corral.services.errors import Forbidden
from corral.services.lifecycle import record_event
from corral.services.oncall import addresses_of, shown_url
from corral.spec import NOTIFY_EVENTS, JobSpecV1, NotifyV1, format_seconds
from corral.words import plural

log = logging.getLogger(__name__)
DIGEST_WINDOW_S = 60.0  # at most one message per user per window; later events wait, then go as one
GROUP_BATCH = 2000  # pending outbox rows read per pass
DIGEST_MAX_LINES = 50  # a digest lists this many events, then counts the rest
LOG_TAIL_LINES = 20
LOG_TAIL_CHARS = 2000
SETTLED = ("sent", "given_up")
LogTail = Callable[[Job], str]  # the last lines of a failed job's log ("" when there are none)


def _no_log_tail(job: Job) -> str:
    return ""


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
    lines = text.rstrip("\n").splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(lines)[-LOG_TAIL_CHARS:]


def describe(session: Session, event: JobNotification, job: Job, base_url: str, now: float) -> dict[str, Any]:
    """One event as a message tells it (the webhook's JSON item; the email's text is made of it)."""
    attempts = list(job.attempts)
    item: dict[str, Any] = {
        "job_id": job.id, "name": job.name, "event": event.event, "state": job.state, "at": event.at,
        "attempt": event.attempt, "reason": event.message or job.reason,
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


def compose(user: str, items: Sequence[dict[str, Any]]) -> Message:
    """One message telling `items` (one event: all of it; several: a digest of one line each)."""
    if len(items) == 1:
        subject = f"[Corral] {_summary(items[0])}"
        body = "\n".join(_detail_lines(items[0]))
    else:
        counts = {e: sum(1 for i in items if i["event"] == e) for e in NOTIFY_EVENTS}
        what = ", ".join(f"{n} {e}" for e, n in counts.items() if n)
        subject = f"[Corral] {plural(len(items), 'job notification')}: {what}"
        lines = [
            f"{plural(len(items), 'job event')} in the last minute ({what}); one message per minute at most:",
            "",
        ]
        for item in items[:DIGEST_MAX_LINES]:
            reason = f": {item['reason']}" if item["reason"] else ""
            lines.append(f"- {_summary(item)}{reason} ({item['url']})")
        if len(items) > DIGEST_MAX_LINES:
            lines.append(f"... and {len(items) - DIGEST_MAX_LINES} more (corral ls)")
        body = "\n".join(lines)
    payload = {"event": "job_notification", "user": user, "count": len(items), "notifications": list(items)}
    return Message(subject[:300], body, payload)


# --- grouping the outbox into messages -----------------------------------------------------------


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


def _items_for(
    session: Session,
    events: Sequence[JobNotification],
    jobs: dict[int, Job],
    base_url: str,
    log_tail: LogTail,
    now: float,
) -> dict[int, dict[str, Any]]:
    items = {}
    for event in events:
        item = describe(session, event, jobs[event.job_id], base_url, now)
        if len(events) == 1 and event.event == "failed":  # a digest lists; a single failure shows its log
            item["log_tail"] = _bounded_tail(log_tail(jobs[event.job_id]))
        items[event.id] = item
    return items


def _group_user(
    session: Session,
    user: User,
    events: Sequence[JobNotification],
    base_url: str,
    log_tail: LogTail,
    now: float,
) -> None:
    """One user's pending events: a message per contact (those of its kinds the jobs asked for),
    all sharing one digest id; events no contact of theirs may carry are `no_contact`."""
    jobs = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_({e.job_id for e in events})))}
    items = _items_for(session, events, jobs, base_url, log_tail, now)
    digest_id = min(e.id for e in events)
    reached: set[int] = set()
    for kind, address in addresses_of(session, user.id):
        mine = [
            e for e in events if not _wanted_kinds(jobs[e.job_id]) or kind in _wanted_kinds(jobs[e.job_id])
        ]
        if not mine:
            continue
        message = compose(user.name, [items[e.id] for e in mine])
        session.add(
            JobNotifyDelivery(
                digest_id=digest_id, user_id=user.id, kind=kind, address=address, subject=message.subject,
                body=message.body, payload=message.payload, events=len(mine), state="pending", attempts=0,
                next_attempt_at=now, last_error="", created_at=now,
            )
        )  # fmt: skip
        reached.update(e.id for e in mine)
    for event in events:
        event.state = "grouped" if event.id in reached else "no_contact"
        event.digest_id = digest_id if event.id in reached else None
        if event.id not in reached:
            what = f"no notification of {event.event!r} sent: {user.name} has no contact"
            kinds = _wanted_kinds(jobs[event.job_id])
            record_event(session, event.job_id, now, what + (f" of kind {'/'.join(kinds)}" if kinds else ""),
                         kind="notify")  # fmt: skip


def group_pending(
    session: Session, now: float, *, base_url: str, log_tail: LogTail = _no_log_tail,
    window_s: float = DIGEST_WINDOW_S,
) -> int:  # fmt: skip
    """Turn pending outbox rows into messages, by the rate rule (module docstring, 3); commits.
    Returns how many rows were grouped (a user still inside their window keeps theirs pending).
    Only the rows of users past their window are read, so one user's flood never holds back the
    others' rows behind it."""
    waiting = set(
        session.scalars(select(JobNotification.user_id).where(JobNotification.state == "pending").distinct())
    )
    last = _last_message_at(session, waiting)
    due_users = {u for u in waiting if u not in last or now >= last[u] + window_s}
    if not due_users:
        return 0
    pending = session.scalars(
        select(JobNotification)
        .where(JobNotification.state == "pending", JobNotification.user_id.in_(due_users))
        .order_by(JobNotification.id)
        .limit(GROUP_BATCH)
    )
    by_user: dict[int, list[JobNotification]] = {}
    for event in pending:
        by_user.setdefault(event.user_id, []).append(event)
    grouped = 0
    # Nothing is flushed until the commit: one user's writes, flushed by the next one's reads,
    # would hold SQLite's write lock through the log reads still to come.
    with session.no_autoflush:
        for user_id, events in by_user.items():
            user = session.get(User, user_id)
            if user is None:
                continue  # the cascade removes their rows
            _group_user(session, user, events, base_url, log_tail, now)
            grouped += len(events)
    session.commit()
    return grouped


def record_outcome(session: Session, delivery: JobNotifyDelivery, now: float) -> None:
    """A message that settled (sent or given up): a `notify` event on every job it told of. The
    address is not named (job events are read by whoever may see the job), only its kind."""
    if delivery.state == "sent":
        what = f"notification sent by {delivery.kind}"
    else:
        error = delivery.last_error.replace(delivery.address, f"({delivery.kind} address)")
        what = (
            f"notification by {delivery.kind} given up after {plural(delivery.attempts, 'attempt')}: {error}"
        )
    digest = f" (one message for {delivery.events} events)" if delivery.events > 1 else ""
    events = session.scalars(select(JobNotification).where(JobNotification.digest_id == delivery.digest_id))
    for event in (e for e in events if tells_of(delivery, e)):
        record_event(session, event.job_id, now, f"{event.event}: {what}{digest}", kind="notify")


def tells_of(delivery: JobNotifyDelivery, event: JobNotification) -> bool:
    """Whether the message tells of the event (a digest's contacts may carry different events of
    it: a job's `to` narrows the kinds)."""
    items = delivery.payload.get("notifications", [])
    return any(i.get("job_id") == event.job_id and i.get("at") == event.at and i.get("event") == event.event
               for i in items)  # fmt: skip


def purge_settled(session: Session, before: float) -> int:
    """Delete settled deliveries made before `before` (their jobs' events keep the outcome)."""
    gone = session.execute(
        delete(JobNotifyDelivery).where(
            JobNotifyDelivery.state.in_(SETTLED), JobNotifyDelivery.created_at < before
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
    return [
        {
            "event": e.event, "at": e.at, "attempt": e.attempt, "state": e.state, "message": e.message,
            "deliveries": [
                _delivery_view(d, shows_address)
                for d in deliveries.get(e.digest_id or 0, [])
                if tells_of(d, e)
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
