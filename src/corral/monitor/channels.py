"""Notification channels (email over SMTP, generic JSON webhook) and the delivery step.

Delivery works through queued `AlertNotification` rows: each due row is sent once per tick; a
failure is recorded on the row (state `failing`, the error, attempts) and retried after an
exponential backoff, until `retry.max_attempts` (then `given_up`). Intake never waits on this.
"""

from __future__ import annotations

import contextlib
import logging
import re
import smtplib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any

import httpx
from sqlalchemy import case, delete, func, select
from sqlalchemy.orm import Session

from corral.db.notify_models import JobNotifyDelivery
from corral.db.oncall_models import PageNotification
from corral.monitor.alerts import alert_to_dict
from corral.monitor.config import EmailChannel, MonitorConfig, WebhookChannel
from corral.monitor.models import Alert, AlertNotification
from corral.services.job_notify import storable
from corral.services.oncall import shown_url

log = logging.getLogger(__name__)
DELIVERY_BATCH = 50
KEEP_DONE_S = 7 * 86400.0  # sent / given-up notifications are kept a week (channel status, audit)


class ChannelError(Exception):
    pass


# Every character str.splitlines() breaks at, which is what Python's email policy refuses in a
# header value (`len(value.splitlines()) > 1`), not only CR and LF (review110 #3).
_LINE_BREAKS = re.compile("[\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]+")


def one_line(text: str) -> str:
    """`text` with each run of line breaks made one space: an email header's value. The line
    breaks are str.splitlines()'s (CR, LF, VT, FF, FS, GS, RS, NEL, U+2028, U+2029)."""
    return _LINE_BREAKS.sub(" ", text)


def summary_line(alert: Alert, status: str) -> str:
    labels = alert.labels or {}
    where = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity"))
    return f"[{status.upper()}] {alert.name} ({alert.severity}) {where}".strip()


def message_text(alert: Alert, status: str) -> str:
    annotations = alert.annotations or {}
    lines = [summary_line(alert, status), ""]
    for key in ("summary", "description", "runbook_url"):
        if annotations.get(key):
            lines.append(f"{key}: {annotations[key]}")
    lines.append("")
    lines += [f"{k}: {v}" for k, v in sorted((alert.labels or {}).items())]
    lines.append(f"source: {alert.source}; fingerprint: {alert.fingerprint}")
    return "\n".join(lines)


class SmtpDeadline:
    """The deadline of one SMTP send (EmailChannel.send_deadline_s), used as a context manager
    around it. smtplib's timeout bounds each socket operation only, so a server answering a line
    at a time, each just within it, held one send open for as long as it liked, past its
    message's claim (corral.monitor.claiming), when another server sends it too. A timer shuts
    the watched connection's socket down when the deadline passes, which ends at once whatever
    the send waits for (a reply of many lines, the message's body); `failure` then names the
    deadline. A socket connected after the deadline is shut down as soon as it is (`opened`);
    only resolving the server's name, which no socket bounds, can outlast it. The timer does
    nothing once the send has ended. `seconds`: another deadline than a whole send's (a QUIT's,
    one operation: channel.timeout)."""

    def __init__(self, channel: EmailChannel, seconds: float | None = None) -> None:
        self.channel = channel
        self.seconds = channel.send_deadline_s if seconds is None else seconds
        self.expired = False
        self._smtp: smtplib.SMTP | None = None
        self._connection: socket.socket | None = None  # a dup of the socket opened, see opened()
        self._ended = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(self.seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> SmtpDeadline:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        with self._lock:  # a timer already firing finishes first; one firing later does nothing
            self._ended = True
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()  # the dup only: the connection itself lives on in its SMTP object

    def watch(self, smtp: smtplib.SMTP) -> None:
        """Shut `smtp`'s socket down (the one it has then: STARTTLS replaces it) at the deadline."""
        with self._lock:
            self._smtp = smtp
        self.check()

    def check(self) -> None:
        """Raise TimeoutError if the deadline has passed: the timer found no socket to shut down
        when it fired (the connection was being made, or STARTTLS was replacing it)."""
        if self.expired:
            raise TimeoutError("send deadline passed")

    def opened(self, sock: socket.socket) -> None:
        """The watched connection's socket, just connected: shut down at once if the deadline
        passed while the address was resolved or tried (the timer found no socket then), so that
        the server's greeting, however many lines, is not waited for (review112 #8). A dup of it
        is kept for the timer: smtplib sets `smtp.sock` only after this returns, and STARTTLS
        detaches it (the TLS socket made from it is set only once the handshake ends), so the
        timer firing then found no socket, or a closed one, and the greeting or the handshake ran
        on; shutting the dup down ends the connection under every socket made of it (review113 #4)."""
        with self._lock:
            if self._ended:
                return
            if self.expired:
                _shut_down(sock)
            elif self._connection is None:
                self._connection = sock.dup()

    def _expire(self) -> None:
        with self._lock:
            if self._ended:
                return
            self.expired = True
            if self._connection is not None:
                _shut_down(self._connection)
            sock = self._smtp.sock if self._smtp is not None else None
            if sock is not None:  # a connection this deadline did not see opened (Mailer's next send)
                _shut_down(sock)

    def failure(self, exc: BaseException) -> ChannelError:
        """The send's error: the deadline's, if it passed (whatever smtplib made of the socket
        shut down under it), else `exc`'s."""
        channel, where = self.channel, f"SMTP {self.channel.smtp_host}:{self.channel.smtp_port}"
        if self.expired:
            return ChannelError(
                f"{where}: the send did not end within its {self.seconds:g} s deadline "
                f"(the whole send's; the channel's timeout, {channel.timeout:g} s, bounds each operation)"
            )
        return ChannelError(f"{where}: {exc}")


def _shut_down(sock: socket.socket) -> None:
    """End `sock`'s connection both ways: a blocked recv returns, a blocked send fails. The base
    class's shutdown, also on an SSLSocket: SSLSocket.shutdown first drops its SSL object, and a
    send of the body's next chunk in between went out in plaintext (review112 #6)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


class WatchedSMTP(smtplib.SMTP):
    """smtplib.SMTP made without a host, so that `deadline` watches it before it connects: its
    connect() keeps the host, as SMTP(host) does (starttls() checks the server's certificate
    against it, and the ssl module refuses to start TLS with none: review112 #1), and the socket
    it opens is shown to the deadline at once (SmtpDeadline.opened)."""

    _host: str

    def __init__(self, deadline: SmtpDeadline, timeout: float) -> None:
        self._deadline = deadline
        super().__init__(timeout=timeout)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        # the hook smtplib's own SMTP_SSL and LMTP override; typeshed does not declare it
        sock = super()._get_socket(host, port, timeout)  # type: ignore[misc]
        self._deadline.opened(sock)
        return sock

    def connect(
        self, host: str = "localhost", port: int = 0, source_address: Any = None
    ) -> tuple[int, bytes]:
        self._host = host
        return super().connect(host, port, source_address)


def open_smtp(channel: EmailChannel, deadline: SmtpDeadline) -> smtplib.SMTP:
    """A connection to `channel`'s SMTP server (STARTTLS and login as it says), watched by
    `deadline` from before it connects."""
    smtp = WatchedSMTP(deadline, channel.timeout)
    deadline.watch(smtp)
    try:
        smtp.connect(channel.smtp_host, channel.smtp_port)
        deadline.check()
        if channel.starttls:
            smtp.starttls()
            deadline.check()
        if channel.username:
            smtp.login(channel.username, channel.password or "")
    except BaseException:
        smtp.close()
        raise
    return smtp


def send_email(channel: EmailChannel, alert: Alert, status: str) -> None:
    msg = EmailMessage()
    msg["Subject"] = one_line(summary_line(alert, status))  # a label value may hold a line break
    msg["From"] = channel.sender
    msg["To"] = ", ".join(channel.to)
    msg["X-Corral-Alert-Fingerprint"] = one_line(alert.fingerprint)  # stored before intake refused one
    msg.set_content(message_text(alert, status))
    deadline = SmtpDeadline(channel)
    try:
        with deadline:
            smtp = open_smtp(channel, deadline)
            try:
                smtp.send_message(msg)
                # Not smtplib's `with`: its exit raised for a QUIT answered other than 221, after
                # the server had accepted the message, which was then sent again (review113 #5)
                with contextlib.suppress(OSError, smtplib.SMTPException):
                    smtp.quit()
            finally:
                smtp.close()
    except (OSError, smtplib.SMTPException) as exc:
        raise deadline.failure(exc) from exc


def send_webhook(channel: WebhookChannel, alert: Alert, status: str) -> None:
    body = {"text": message_text(alert, status), "status": status, "alert": alert_to_dict(alert)}
    try:
        response = httpx.post(channel.url, json=body, headers=channel.headers, timeout=channel.timeout)
    except httpx.HTTPError as exc:
        raise ChannelError(f"POST {shown_url(channel.url)}: {exc}") from exc
    if response.status_code >= 300:
        raise ChannelError(
            f"POST {shown_url(channel.url)}: HTTP {response.status_code} {response.text[:200]}"
        )


def send(channel: EmailChannel | WebhookChannel, alert: Alert, status: str) -> None:
    """Announce `status`: the one the notification was queued for, even if the alert moved on."""
    if isinstance(channel, EmailChannel):
        send_email(channel, alert, status)
    else:
        send_webhook(channel, alert, status)


def deliver_due(session_factory: Callable[[], Session], config: MonitorConfig, now: float) -> int:
    """Send the notifications that are due; returns how many were sent successfully."""
    channels = {c.name: c for c in config.channels}
    with session_factory() as session:
        session.execute(
            delete(AlertNotification).where(
                AlertNotification.state.in_(("sent", "given_up")),
                AlertNotification.created_at < now - KEEP_DONE_S,
            )
        )
        session.commit()
        due = session.scalars(
            select(AlertNotification)
            .where(
                AlertNotification.state.in_(("pending", "failing")), AlertNotification.next_attempt_at <= now
            )
            .order_by(AlertNotification.next_attempt_at, AlertNotification.id)
            .limit(DELIVERY_BATCH)
        ).all()
        sent = 0
        for note in due:
            channel = channels.get(note.channel)
            alert = session.get(Alert, note.alert_id)
            note.attempts += 1
            if channel is None or alert is None:
                note.state, note.next_attempt_at = "given_up", now
                note.last_error = (
                    "the channel is no longer configured" if channel is None else "alert deleted"
                )
                session.commit()
                continue
            try:
                send(channel, alert, note.alert_status)
            except ChannelError as exc:
                record_failure(note, str(exc), config, now)
                log.warning("channel %s failed (attempt %d): %s", note.channel, note.attempts, exc)
            except Exception as exc:  # one notification's unexpected error is its own failure, not the
                # pass's: the pass would roll its attempt back, and it would block those after it
                record_failure(note, f"{type(exc).__name__}: {exc}", config, now)
                log.exception("channel %s failed unexpectedly (attempt %d)", note.channel, note.attempts)
            else:
                note.state = "sent"
                note.sent_at = now
                note.last_error = ""
                sent += 1
            session.commit()  # per notification: one slow channel never loses another's result
        return sent


def record_failure(
    note: AlertNotification | PageNotification | JobNotifyDelivery,
    error: str,
    config: MonitorConfig,
    now: float,
) -> None:
    """A delivery that failed (an alert's, a page's or a job notification's): try again after the
    backoff, or give up after `retry.max_attempts`."""
    note.last_error = storable(error)[:2000]  # a NUL from a webhook's answer: PostgreSQL refuses it
    if note.attempts >= config.retry.max_attempts:
        note.state, note.next_attempt_at = "given_up", now  # never due again: when it was given up
        return
    note.state = "failing"
    note.next_attempt_at = now + config.retry.backoff_s(note.attempts)


def failing_channels(session: Session) -> set[str]:
    """The channels whose state is `failing`: a notification of theirs is being retried, or the
    last of their notifications to settle was given up (a channel whose every notification was
    given up is not `ok`). The next one sent makes the channel `ok` again. A given-up row's
    `next_attempt_at` is when it was given up (record_failure); settled rows are pruned after
    KEEP_DONE_S."""
    latest: dict[tuple[str, str], float | None] = {
        (channel, state): at
        for channel, state, at in session.execute(
            select(
                AlertNotification.channel,
                AlertNotification.state,
                func.max(
                    case(
                        (AlertNotification.state == "sent", AlertNotification.sent_at),
                        else_=AlertNotification.next_attempt_at,
                    )
                ),
            )
            .where(AlertNotification.state.in_(("failing", "sent", "given_up")))
            .group_by(AlertNotification.channel, AlertNotification.state)
        )
    }
    failing = {channel for channel, state in latest if state == "failing"}
    for (channel, state), given_up_at in latest.items():
        sent_at = latest.get((channel, "sent"))
        if state == "given_up" and (sent_at is None or (given_up_at or 0.0) > sent_at):
            failing.add(channel)
    return failing


@dataclass(frozen=True)
class ChannelStatus:
    name: str
    type: str
    state: str  # ok | failing (failing_channels)
    pending: int
    failing: int
    given_up: int
    sent: int
    last_sent_at: float | None
    last_error: str

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def channel_statuses(session: Session, config: MonitorConfig) -> list[ChannelStatus]:
    counts: dict[tuple[str, str], int] = {
        (ch, st): n
        for ch, st, n in session.execute(
            select(AlertNotification.channel, AlertNotification.state, func.count()).group_by(
                AlertNotification.channel, AlertNotification.state
            )
        )
    }
    failing_now = failing_channels(session)
    out = []
    for channel in config.channels:
        last_sent = session.scalar(
            select(func.max(AlertNotification.sent_at)).where(AlertNotification.channel == channel.name)
        )
        last_error = session.scalar(
            select(AlertNotification.last_error)
            .where(AlertNotification.channel == channel.name, AlertNotification.last_error != "")
            .order_by(AlertNotification.id.desc())
            .limit(1)
        )
        failing = counts.get((channel.name, "failing"), 0)
        out.append(
            ChannelStatus(
                name=channel.name, type=channel.type,
                state="failing" if channel.name in failing_now else "ok",
                pending=counts.get((channel.name, "pending"), 0), failing=failing,
                given_up=counts.get((channel.name, "given_up"), 0),
                sent=counts.get((channel.name, "sent"), 0),
                last_sent_at=last_sent, last_error=last_error or "",
            )
        )  # fmt: skip
    return out
