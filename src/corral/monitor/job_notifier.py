"""The job notification loop: groups the lifecycle's outbox rows into messages
(corral.services.job_notify.group_pending, one message per user per minute at most) and sends
them, through the paging loop's transports (corral.monitor.pager: the SMTP server and sender of
the email channel pages use, CORRAL_PAGING_EMAIL_CHANNEL; webhooks guarded and pinned against
SSRF, CORRAL_WEBHOOK_ALLOW_NETWORKS) and the monitor config's retry policy (backoff, then
`given_up`).

A leased singleton, but the lease (renewed between ticks) does not cover a long tick, so
nothing here relies on it: grouping moves the outbox rows and sending claims each message by
compare-and-set, so two overlapping passes (two servers) never group one event twice nor send
one claimed message twice. Delivery is at least once: each message's outcome is committed as
soon as it is known, so a crash (or a lost database) between a send and its commit sends that
one message again after SENDING_RETRY_S, never silently drops it; nothing else is repeated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from corral.config import portal_url
from corral.db.models import Job, User
from corral.db.notify_models import JobNotifyDelivery
from corral.diagnosis.logtail import failing_rank, read_tail
from corral.engine.base import Engine, EngineUnavailable
from corral.monitor.channels import ChannelError, record_failure
from corral.monitor.claiming import (
    SEND_BUDGET_S,
    ClaimingPass,
    claim_message,
    due_messages,
    give_up_reclaimed,
    reclaimed_too_often,
)
from corral.monitor.config import MonitorConfig
from corral.monitor.loops import monitor_config
from corral.monitor.pager import SETTINGS as PAGING
from corral.monitor.pager import Mailer, email_transport, post_json, slack_text
from corral.server.context import BackgroundLoop, ServerContext
from corral.services import job_notify, oncall, webhook_guard

log = logging.getLogger("corral.monitor.job_notifier")
DELIVERY_BATCH = 200
TAIL_BYTES = 16 * 1024  # read of a failed job's log; job_notify keeps its last lines


class JobNotifySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORRAL_JOB_NOTIFY_", extra="ignore")

    interval_s: float = 2.0  # grouping and delivery pass
    keep_days: float = 90.0  # settled deliveries are deleted after this (the jobs' events stay)


def log_tail_of(engine: Engine | None) -> job_notify.LogTail:
    """The last part of a failed job's log, from its last attempt's failing rank; "" when the
    engine has none of it (removed, or the engine is away): a message never waits for a log."""

    def tail(job: Job) -> str:
        if engine is None or not job.attempts:
            return ""
        attempt = max(job.attempts, key=lambda a: a.number)
        try:
            return read_tail(engine, attempt.attempt_id, failing_rank(attempt.message), TAIL_BYTES)
        except (OSError, EngineUnavailable, ValueError) as exc:
            log.info("no log tail for job %s: %s", job.id, exc)
            return ""

    return tail


def _send(mailer: Mailer, delivery: JobNotifyDelivery, allowed: Sequence[webhook_guard.Network]) -> None:
    if delivery.kind == "email":
        headers = {"X-Corral-Notification": str(delivery.digest_id)}
        mailer.send_text(delivery.address, delivery.subject, delivery.body, headers)
    elif delivery.kind == "slack":  # Slack and Mattermost incoming webhooks both read `text`
        text = slack_text(f"*{delivery.subject}*") + "\n" + slack_text(delivery.body)
        post_json(delivery.address, {"username": "Corral", "text": text}, allowed)
    else:
        post_json(delivery.address, delivery.payload, allowed)


def _send_claimed(
    session: Session, mailer: Mailer, delivery: JobNotifyDelivery, config: MonitorConfig,
    clock: Callable[[], float], allowed: Sequence[webhook_guard.Network],
) -> float:  # fmt: skip
    """Send one claimed message and set its outcome on the row (not committed); returns the
    outcome's time, read from `clock` (ClaimingPass.at) when the send ended: a 30 s send's
    sent_at and backoff are not 30 s early (review110 #11). Any error is that message's failure
    (retried, then given up), never the pass's. A message whose owner was deactivated, or whose
    address they removed or changed since it was grouped, is given up unsent, saying why
    (services.oncall.no_longer_reaches)."""
    owner = session.get(User, delivery.user_id)
    if owner is None:
        why: str | None = "its owner's account is deactivated"
    else:
        why = oncall.no_longer_reaches(session, owner, delivery.kind, delivery.address)
    if why is not None:
        delivery.state, delivery.last_error = "given_up", why
        delivery.next_attempt_at = now = clock()  # when it was given up, as record_failure writes it
        return now
    failure: str | None = None
    try:
        _send(mailer, delivery, allowed)
    except ChannelError as exc:
        failure = str(exc)
        log.warning("job notification %s (%s) failed: %s", delivery.id, delivery.kind, exc)
    except Exception as exc:  # one message's unexpected error is its own failure
        failure = f"{type(exc).__name__}: {exc}"
        log.exception("job notification %s (%s) failed unexpectedly", delivery.id, delivery.kind)
    ended = clock()
    if failure is None:
        delivery.state, delivery.sent_at, delivery.last_error = "sent", ended, ""
    else:
        record_failure(delivery, failure, config, ended)
    return ended


def _store_outcome(session: Session, delivery: JobNotifyDelivery, claim_until: float, now: float) -> None:
    """Commit one message's outcome (and, settled, its jobs' events) on its own, so that it
    stands whatever happens to the next, where this pass's claim still stands (`sending`, due
    again at `claim_until`, as _claim left it; a later claim, made only once this one expired,
    is due later): a pass so slow that another took the message over leaves that pass's outcome
    and events be, as the pager's _store_outcome (review110 #5). Should the commit fail, the
    outcome's state is still written, without its words: a message sent is never sent again for
    want of a record, and a settled one keeps no text there either (job_notify.settled_text, as
    record_outcome)."""
    delivery_id, state, error = delivery.id, delivery.state, delivery.last_error
    outcome = {
        "state": state, "next_attempt_at": delivery.next_attempt_at, "attempts": delivery.attempts,
        "sent_at": now if state == "sent" else None,
    }  # fmt: skip
    text = job_notify.settled_text(dict(delivery.payload)) if state in job_notify.SETTLED else {}
    ours = (
        JobNotifyDelivery.id == delivery_id,
        JobNotifyDelivery.state == "sending",
        JobNotifyDelivery.next_attempt_at == claim_until,
    )
    try:
        with session.no_autoflush:  # the outcome is written by the claim's compare-and-set first
            stored = session.execute(
                update(JobNotifyDelivery).where(*ours).values(**outcome, last_error=error, **text)
                .execution_options(synchronize_session=False)
            )  # fmt: skip
        if stored.rowcount != 1:  # type: ignore[attr-defined]
            session.rollback()
            log.warning("job notification %s: its claim expired before its outcome (%s)", delivery_id, state)
            return
        if state in job_notify.SETTLED:
            job_notify.record_outcome(session, delivery, now)
        session.commit()
    except SQLAlchemyError as exc:
        session.rollback()
        log.exception("job notification %s: outcome %s not stored in full", delivery_id, state)
        words = f"the outcome's details could not be stored ({type(exc).__name__})" if error else ""
        session.execute(
            update(JobNotifyDelivery).where(*ours).values(**outcome, last_error=words, **text)
            .execution_options(synchronize_session=False)
        )  # fmt: skip
        session.commit()


def deliver(
    session_factory: Callable[[], Session],
    config: MonitorConfig,
    now: float,
    webhook_networks: Sequence[webhook_guard.Network] = (),
) -> int:
    """Send the due messages; returns how many this pass claimed. Each is claimed on its own by
    compare-and-set (`sending`, due again after SENDING_RETRY_S), sent (over one SMTP connection
    for the pass), and its outcome committed at once; each settled one (sent, given up) is a
    `notify` event on the jobs it told of. Each claim's time is read when it is made, and no new
    claim after SEND_BUDGET_S of the pass (corral.monitor.claiming), so a claim is always sent
    (or settled) long before SENDING_RETRY_S lets another pass take it."""
    mailer = Mailer(email_transport(config, PAGING.email_channel))
    claiming = ClaimingPass(now, SEND_BUDGET_S)
    handled = 0
    try:
        with session_factory() as session:
            for seen in due_messages(session, JobNotifyDelivery, now, DELIVERY_BATCH):
                at = claiming.claim_time()
                if at is None:
                    break
                delivery = claim_message(session, JobNotifyDelivery, seen, at)
                if delivery is None:
                    continue
                claim_until = delivery.next_attempt_at
                if reclaimed_too_often(seen[1], delivery, config.retry.max_attempts):
                    give_up_reclaimed(delivery, at)
                else:
                    at = _send_claimed(session, mailer, delivery, config, claiming.at, webhook_networks)
                _store_outcome(session, delivery, claim_until, at)
                handled += 1
            return handled
    finally:
        mailer.close()


PURGE_EVERY_S = 3600.0
_purged_at: dict[str, float] = {}  # per server process (owner id): when it last purged


def job_notify_tick(ctx: ServerContext, now: float) -> float | None:
    with ctx.session_factory() as session:
        job_notify.group_pending(session, now, base_url=portal_url(), log_tail=log_tail_of(ctx.engine))
        if now - _purged_at.get(ctx.owner_id, 0.0) >= PURGE_EVERY_S:
            job_notify.purge_settled(session, now - SETTINGS.keep_days * 86400.0)
            _purged_at[ctx.owner_id] = now
    networks = webhook_guard.parse_networks(ctx.settings.webhook_allow_networks)
    # the clock read again: grouping may have read logs for a while, and a claim's expiry
    # (SENDING_RETRY_S) must count from when it is made
    handled = deliver(ctx.session_factory, monitor_config(ctx), max(now, time.time()), networks)
    more = handled >= DELIVERY_BATCH
    return 0.0 if more else None  # more may be waiting: the next pass at once


SETTINGS = JobNotifySettings()
LOOPS: list[BackgroundLoop] = [BackgroundLoop("job-notify", SETTINGS.interval_s, job_notify_tick)]
