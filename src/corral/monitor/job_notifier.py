"""The job notification loop: groups the lifecycle's outbox rows into messages
(corral.services.job_notify.group_pending, one message per user per minute at most) and sends
them, through the paging loop's transports (corral.monitor.pager: the SMTP server and sender of
the email channel pages use, CORRAL_PAGING_EMAIL_CHANNEL; webhooks guarded and pinned against
SSRF, CORRAL_WEBHOOK_ALLOW_NETWORKS) and the monitor config's retry policy (backoff, then
`given_up`), claimed as the page deliveries are. A leased singleton, so two servers never send
one message twice; delivery is at least once (a message sent just before a crash may go again
after SENDING_RETRY_S, never silently dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.models import Job
from corral.db.notify_models import JobNotifyDelivery
from corral.diagnosis.logtail import failing_rank, read_tail
from corral.engine.base import Engine, EngineUnavailable
from corral.monitor.channels import ChannelError, record_failure
from corral.monitor.config import MonitorConfig
from corral.monitor.loops import monitor_config
from corral.monitor.pager import SETTINGS as PAGING
from corral.monitor.pager import Mailer, email_transport, post_json, public_url
from corral.server.context import BackgroundLoop, ServerContext
from corral.services import job_notify, webhook_guard

log = logging.getLogger("corral.monitor.job_notifier")
DELIVERY_BATCH = 200
SENDING_RETRY_S = 300.0  # a batch claimed by a process that died is sent again after this
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
        post_json(
            delivery.address,
            {"username": "Corral", "text": f"*{delivery.subject}*\n{delivery.body}"},
            allowed,
        )
    else:
        post_json(delivery.address, delivery.payload, allowed)


def deliver(
    session_factory: Callable[[], Session],
    config: MonitorConfig,
    now: float,
    webhook_networks: Sequence[webhook_guard.Network] = (),
) -> int:
    """Send the due messages; returns how many were handled. Claimed as a batch (`sending`, due
    again after SENDING_RETRY_S), sent over one SMTP connection, outcomes written together, and
    each settled one (sent, given up) a `notify` event on the jobs it told of."""
    mailer = Mailer(email_transport(config, PAGING.email_channel))
    try:
        with session_factory() as session:
            due = list(
                session.scalars(
                    select(JobNotifyDelivery)
                    .where(
                        JobNotifyDelivery.state.in_(("pending", "failing", "sending")),
                        JobNotifyDelivery.next_attempt_at <= now,
                    )
                    .order_by(JobNotifyDelivery.next_attempt_at, JobNotifyDelivery.id)
                    .limit(DELIVERY_BATCH)
                )
            )
            if not due:
                return 0
            for delivery in due:
                delivery.state, delivery.next_attempt_at = "sending", now + SENDING_RETRY_S
                delivery.attempts += 1
            session.commit()
            for delivery in due:
                try:
                    _send(mailer, delivery, webhook_networks)
                except ChannelError as exc:
                    record_failure(delivery, str(exc), config, now)
                    log.warning("job notification %s (%s) failed: %s", delivery.id, delivery.kind, exc)
                else:
                    delivery.state, delivery.sent_at, delivery.last_error = "sent", now, ""
            # After every send: recording reads the outbox, and the flush that read makes would
            # hold SQLite's write lock through the sends still to come.
            for delivery in (d for d in due if d.state in job_notify.SETTLED):
                job_notify.record_outcome(session, delivery, now)
            session.commit()
            return len(due)
    finally:
        mailer.close()


PURGE_EVERY_S = 3600.0
_purged_at: dict[str, float] = {}  # per server process (owner id): when it last purged


def job_notify_tick(ctx: ServerContext, now: float) -> float | None:
    with ctx.session_factory() as session:
        grouped = job_notify.group_pending(
            session, now, base_url=public_url(), log_tail=log_tail_of(ctx.engine)
        )
        if now - _purged_at.get(ctx.owner_id, 0.0) >= PURGE_EVERY_S:
            job_notify.purge_settled(session, now - SETTINGS.keep_days * 86400.0)
            _purged_at[ctx.owner_id] = now
    networks = webhook_guard.parse_networks(ctx.settings.webhook_allow_networks)
    handled = deliver(ctx.session_factory, monitor_config(ctx), now, networks)
    more = handled >= DELIVERY_BATCH or grouped >= job_notify.GROUP_BATCH
    return 0.0 if more else None  # more may be waiting: the next pass at once


SETTINGS = JobNotifySettings()
LOOPS: list[BackgroundLoop] = [BackgroundLoop("job-notify", SETTINGS.interval_s, job_notify_tick)]
