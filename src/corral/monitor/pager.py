"""The paging loop: escalates due pages (corral.services.paging.escalate_due) and sends their
queued notifications, each to one person at one address, with that person's signed acknowledge
link (docs/operations.md, "Notifications").

- **email**: through the SMTP server and sender of a `type: email` channel of monitor.yml (the
  one named by CORRAL_PAGING_EMAIL_CHANNEL, else the first), addressed to the person only; one
  SMTP connection per pass. No email channel: the notification fails with that reason.
- **slack**: a Slack/Mattermost incoming-webhook body (`text`, `attachments`).
- **webhook**: a generic JSON body (`event`, `page`, `recipient`, `ack_url`, ...).

A failure is retried with the monitor config's retry policy (backoff, then `given_up`), like
alert notifications; a notification of a page acknowledged or cancelled before it went out is
`skipped`, and so is one whose address its person removed (or whose email changed) since it was
queued, or whose account was deactivated: its last_error says which.

A leased singleton, but the lease (renewed between ticks) does not cover a long tick, so nothing
here relies on it: each notification is claimed by compare-and-set, with its claimer and expiry,
just before it is sent (`deliver_pages`), as job notifications are (corral.monitor.job_notifier),
so two servers' overlapping passes never send one notification twice. The claim's expiry counts
from when it is made, and a pass makes no claim after SEND_BUDGET_S (corral.monitor.claiming),
so a slow pass's claims do not expire while it is still sending.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import secrets
import smtplib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any

import httpx
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import update
from sqlalchemy.orm import Session

from corral.config import portal_url
from corral.db.models import User
from corral.db.oncall_models import Page, PageNotification
from corral.monitor.channels import ChannelError, SmtpDeadline, one_line, open_smtp, record_failure
from corral.monitor.claiming import (
    SEND_BUDGET_S,
    ClaimingPass,
    claim_message,
    due_messages,
    give_up_reclaimed,
    reclaimed_too_often,
)
from corral.monitor.config import EmailChannel, MonitorConfig
from corral.monitor.loops import monitor_config
from corral.server.context import BackgroundLoop, ServerContext
from corral.services import webhook_guard
from corral.services.oncall import no_longer_reaches, shown_url
from corral.services.paging import ESCALATE_BATCH, OPEN_STATES, ack_token, escalate_due, link_key, purge_ended
from corral.services.rotation import utc_text

log = logging.getLogger("corral.monitor.pager")
DELIVERY_BATCH = 200
# The owner of this process's claims when the caller names none (the server passes its lease
# owner id, ServerContext.owner_id): unique per process, as two servers' must differ.
PROCESS_OWNER = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"[:64]


class PagingSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORRAL_PAGING_", extra="ignore")

    interval_s: float = 1.0  # escalation and delivery pass (a started page wakes it at once)
    email_channel: str | None = None  # monitor.yml email channel whose SMTP server pages use
    link_ttl_s: float = 24 * 3600.0  # how long an acknowledge link works
    keep_days: float = 90.0  # ended pages (and their notifications) are deleted after this


@dataclass(frozen=True)
class Outgoing:
    """One notification ready to send: the page, the person and their acknowledge link."""

    note: PageNotification
    page: Page
    user: str
    ack_url: str
    ack_expires_at: float

    def text(self) -> str:
        return "\n".join(
            [
                self.page.body or self.page.subject,
                "",
                f"You are paged by escalation policy {self.page.policy_name!r} "
                f"(round {self.note.round + 1}, step {self.note.step + 1}).",
                f"Acknowledge (no login needed; works until {utc_text(self.ack_expires_at)}):",
                self.ack_url,
            ]
        )


def email_transport(config: MonitorConfig, wanted: str | None) -> EmailChannel | None:
    emails = [c for c in config.channels if isinstance(c, EmailChannel)]
    if wanted is not None:
        return next((c for c in emails if c.name == wanted), None)
    return emails[0] if emails else None


class Mailer:
    """One SMTP connection for a delivery pass, opened on first use; each send (the connection's
    opening included, for the first) ends by its deadline (channels.SmtpDeadline)."""

    def __init__(self, channel: EmailChannel | None) -> None:
        self.channel = channel
        self.smtp: smtplib.SMTP | None = None

    def send(self, out: Outgoing) -> None:
        headers = {"X-Corral-Page": out.page.key}
        self.send_text(out.note.address, f"[Corral page] {out.page.subject}", out.text(), headers)

    def send_text(self, to: str, subject: str, text: str, headers: dict[str, str]) -> None:
        """One plain-text message to one address (a page's, a job notification's). The subject
        and headers on one line each: a page's subject may hold line breaks (an admin's, an
        alert rule's title), which EmailMessage refuses in a header (review109 #2)."""
        channel = self.channel
        if channel is None:
            raise ChannelError("no email channel in monitor.yml to send through (smtp_host, from)")
        msg = EmailMessage()
        msg["Subject"] = one_line(subject)
        msg["From"] = channel.sender
        msg["To"] = to
        for name, value in headers.items():
            msg[name] = one_line(value)
        msg.set_content(text)
        deadline = SmtpDeadline(channel)  # the whole send's, connecting included (rough14 #2)
        try:
            with deadline:
                if self.smtp is None:
                    self.smtp = open_smtp(channel, deadline)
                else:
                    deadline.watch(self.smtp)
                self.smtp.send_message(msg)
        except (OSError, smtplib.SMTPException) as exc:
            self.abandon()  # no QUIT: its wait came before the failure's outcome was stored
            raise deadline.failure(exc) from exc
        if deadline.expired:  # as the send ended: the message went, its connection was shut down
            self.abandon()

    def abandon(self) -> None:
        """Close the connection without QUIT: after a failed send (or one its deadline cut), a QUIT
        waited on a live server before the message's outcome was stored, and with the send's own
        wait could outlast the message's claim, when another server sends it again (review113 #3)."""
        smtp, self.smtp = self.smtp, None
        if smtp is not None:
            smtp.close()

    def close(self) -> None:
        """QUIT and close the connection, by a deadline of its own, one operation's (the channel's
        timeout): a server answering QUIT a line at a time, each within the timeout, held the
        pass's end (review112 #7)."""
        smtp, channel = self.smtp, self.channel
        if smtp is None or channel is None:
            return
        self.smtp = None
        deadline = SmtpDeadline(channel, channel.timeout)
        try:
            with deadline:
                deadline.watch(smtp)
                smtp.quit()
        except (OSError, smtplib.SMTPException):
            pass  # the messages' outcomes are settled: only the connection is left to end
        finally:
            smtp.close()


_SLACK_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def slack_text(text: str) -> str:
    """`text` as Slack/Mattermost show it literally: `&`, `<`, `>` escaped (Slack's own rule, so
    no `<!channel>`, `<@U...>` or disguised `<url|text>` link), and a zero-width space after every
    `@`, so nobody is pinged: Mattermost reads bare mentions, of a channel (@channel, @here, @all)
    or of a person, and a pattern for the broadcast words missed `x.@channel` and `@here_`
    (review108 #7)."""
    return text.translate(_SLACK_ESCAPES).replace("@", "@\u200b")


def webhook_body(out: Outgoing) -> dict[str, Any]:
    if out.note.kind == "slack":  # Slack and Mattermost incoming webhooks both read these fields
        subject, text = slack_text(out.page.subject), slack_text(out.text())
        return {
            "username": "Corral",
            "text": f"*Page: {subject}* for {out.user} - acknowledge: {out.ack_url}",
            "attachments": [
                {
                    "fallback": text, "color": "#d00000", "title": subject,
                    "title_link": out.ack_url, "text": text,
                }
            ],
        }  # fmt: skip
    return {
        "event": "page",
        "page": {
            "id": out.page.id, "key": out.page.key, "subject": out.page.subject, "body": out.page.body,
            "policy": out.page.policy_name, "state": out.page.state, "round": out.note.round + 1,
            "step": out.note.step + 1, "created_at": out.page.created_at,
        },
        "recipient": out.user,
        "ack_url": out.ack_url,
        "ack_expires_at": out.ack_expires_at,
    }  # fmt: skip


# The most one webhook POST may take, its host's DNS lookup, connection and answer included: well
# under a message's 300 s claim (job_notifier, pages).
WEBHOOK_DEADLINE_S = 30.0


def post_webhook(out: Outgoing, allowed: Sequence[webhook_guard.Network] = ()) -> None:
    """POST the page to a person's webhook. Its errors, kept as the notification's last_error and
    shown in page views (to admins and to everyone the page notified), name the URL as
    scheme://host:port/... only: a Slack/Mattermost webhook's path is its credential.

    The host is resolved and each address checked again now (corral.services.webhook_guard;
    `allowed`: the admin's CORRAL_WEBHOOK_ALLOW_NETWORKS), and the request goes to the address
    checked, the name kept for the Host header and TLS, so a DNS answer changed since (or
    between the check and the connection) cannot turn it to the cluster's own network."""
    post_json(out.note.address, webhook_body(out), allowed)


def post_json(address: str, body: dict[str, Any], allowed: Sequence[webhook_guard.Network] = ()) -> None:
    """POST `body` to a person's webhook URL, guarded and pinned as `post_webhook` says (a page's,
    a job notification's); ChannelError naming the URL as scheme://host:port/... only."""
    shown = shown_url(address)
    try:
        url = httpx.URL(address)
        # The whole POST has a deadline, its host's lookup included, not only each read: a
        # receiver that answers a byte every few seconds (review108 #3), or a resolver that does
        # not answer, held a send open for ever, and with it every other message of the loop,
        # past the message's claim, so that another server sent it again.
        response = asyncio.run(asyncio.wait_for(_post_guarded(url, body, allowed), WEBHOOK_DEADLINE_S))
    except TimeoutError as exc:
        raise ChannelError(f"POST {shown}: no complete answer within {WEBHOOK_DEADLINE_S:g} s") from exc
    except (
        webhook_guard.WebhookRefused,
        httpx.HTTPError,
        httpx.InvalidURL,
    ) as exc:  # InvalidURL: not an HTTPError
        raise ChannelError(f"POST {shown}: {exc}") from exc
    if response.status_code >= 300:
        raise ChannelError(f"POST {shown}: HTTP {response.status_code} {response.text[:200]}")


async def _post_guarded(
    url: httpx.URL, body: dict[str, Any], allowed: Sequence[webhook_guard.Network]
) -> httpx.Response:
    """Resolve and check `url`'s host (webhook_guard.checked_addresses), then POST to an address
    checked; the lookup waited for here, so that the caller's deadline bounds it too."""
    addresses = await _checked_addresses(url.host, webhook_guard.port_of(url), allowed)
    return await _post_pinned(url, addresses, body)


async def _checked_addresses(
    host: str, port: int, allowed: Sequence[webhook_guard.Network]
) -> list[webhook_guard.Address]:
    """webhook_guard.checked_addresses in a daemon thread of its own, awaited: getaddrinfo blocks
    and cannot be cancelled, so a deadline can only stop waiting for it. Not the event loop's
    default executor, which asyncio.run joins on its way out (a hung lookup would hold the send
    again); the abandoned thread ends when the resolver gives up, holding nothing."""
    lookup: concurrent.futures.Future[list[webhook_guard.Address]] = concurrent.futures.Future()

    def run() -> None:
        if not lookup.set_running_or_notify_cancel():  # running: a cancelled wait leaves it alone
            return  # the wait was given up before this thread began
        try:
            lookup.set_result(webhook_guard.checked_addresses(host, port, allowed))
        except BaseException as exc:  # handed to the waiter, which raises it
            lookup.set_exception(exc)

    threading.Thread(target=run, name=f"webhook-lookup {host}", daemon=True).start()
    return await asyncio.wrap_future(lookup)


async def _post_pinned(
    url: httpx.URL, addresses: Sequence[webhook_guard.Address], body: dict[str, Any]
) -> httpx.Response:
    """POST `body` to `url` at the first of its checked `addresses` that takes the connection, as
    a connection to the name tries each address the resolver gave (one AAAA without an IPv6
    route, one of several A records down); the name kept for the Host header and TLS. Async so
    that the caller's deadline cancels it wherever it waits."""
    async with httpx.AsyncClient(timeout=10.0) as client:
        for address in addresses[:-1]:
            try:
                return await client.send(_pinned_request(client, url, address, body))
            except (httpx.ConnectError, httpx.ConnectTimeout):
                continue
        return await client.send(_pinned_request(client, url, addresses[-1], body))


def _pinned_request(
    client: httpx.AsyncClient, url: httpx.URL, address: webhook_guard.Address, body: dict[str, Any]
) -> httpx.Request:
    return client.build_request(
        "POST",
        url.copy_with(host=str(address)),
        json=body,
        headers={"Host": url.netloc.decode("ascii")},
        extensions={"sni_hostname": url.host} if url.scheme == "https" else None,
    )


def _store_outcome(session: Session, note: PageNotification, owner: str, claim_until: float) -> None:
    """Commit one notification's outcome, set on `note` by _send_one, where this process's claim
    still stands (`sending`, claimed by `owner`, expiring at `claim_until`): a pass so slow that
    its claim expired and another server took the notification leaves that server's outcome be."""
    note_id = note.id
    outcome = {
        "state": note.state, "last_error": note.last_error, "next_attempt_at": note.next_attempt_at,
        "sent_at": note.sent_at,
    }  # fmt: skip
    session.expire(note)  # the outcome is written below, on this claim only, not by a flush
    stored = session.execute(
        update(PageNotification)
        .where(
            PageNotification.id == note_id,
            PageNotification.state == "sending",
            PageNotification.claimed_by == owner,
            PageNotification.next_attempt_at == claim_until,
        )
        .values(**outcome)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    if stored.rowcount != 1:  # type: ignore[attr-defined]
        log.warning(
            "page notification %s: its claim expired before its outcome (%s)", note_id, outcome["state"]
        )


def _send_one(mailer: Mailer, note: PageNotification, page: Page | None, user: User | None, key: bytes,
              config: MonitorConfig, settings: PagingSettings, now: float, clock: Callable[[], float],
              allowed: Sequence[webhook_guard.Network], gone: str | None) -> None:  # fmt: skip
    """Send one claimed notification and record the outcome on its row (not committed). Any error
    is that notification's failure (retried, then given up), never the pass's. `gone`: why its
    address no longer reaches the person (services.oncall.no_longer_reaches), if so. `now`: the
    claim's time, from which the acknowledge link's lifetime counts; the outcome's time (sent_at,
    a failure's backoff) is read from `clock` (ClaimingPass.at) when the send ended, as the job
    notifier's: a 30 s send is not recorded 30 s early."""
    if page is None or user is None or page.state not in OPEN_STATES:
        note.state, note.last_error = "skipped", "the page was acknowledged or cancelled first"
        return
    if gone is not None:  # removed or changed since it was queued: nothing more goes there
        note.state, note.last_error = "skipped", gone
        return
    expires = now + settings.link_ttl_s
    url = f"{portal_url()}/api/v1/ack/{ack_token(key, page.id, user.id, expires)}"
    out = Outgoing(note, page, user.name, url, expires)
    failure: str | None = None
    try:
        mailer.send(out) if note.kind == "email" else post_webhook(out, allowed)
    except ChannelError as exc:
        failure = str(exc)
        log.warning("page %s to %s (%s) failed: %s", page.key, user.name, note.kind, exc)
    except Exception as exc:  # one notification's unexpected error is its own failure, not the pass's
        failure = f"{type(exc).__name__}: {exc}"
        log.exception("page %s to %s (%s) failed unexpectedly", page.key, user.name, note.kind)
    ended = clock()
    if failure is None:
        note.state, note.sent_at, note.last_error = "sent", ended, ""
    else:
        record_failure(note, failure, config, ended)


def _handle(
    session: Session, mailer: Mailer, note: PageNotification, key: bytes, config: MonitorConfig,
    settings: PagingSettings, now: float, clock: Callable[[], float],
    allowed: Sequence[webhook_guard.Network],
) -> None:  # fmt: skip
    """Send one claimed notification (or skip it), its page, person and their contacts read now."""
    page, user = session.get(Page, note.page_id), session.get(User, note.user_id)
    gone = None if user is None else no_longer_reaches(session, user, note.kind, note.address)
    _send_one(mailer, note, page, user, key, config, settings, now, clock, allowed, gone)


def deliver_pages(
    session_factory: Callable[[], Session],
    config: MonitorConfig,
    settings: PagingSettings,
    key: bytes,
    now: float,
    webhook_networks: Sequence[webhook_guard.Network] = (),
    *,
    owner: str = PROCESS_OWNER,
) -> int:
    """Send the due page notifications; returns how many this pass claimed (sent, failed or
    skipped). `webhook_networks`: the private networks people's webhooks may reach (the admin's
    CORRAL_WEBHOOK_ALLOW_NETWORKS; none by default); `owner`: this server process's lease owner
    id (ServerContext.owner_id).

    Each notification is claimed on its own by compare-and-set (`_claim`: `sending`, claimed by
    `owner`, due again after SENDING_RETRY_S), just before it is sent (over one SMTP connection
    for the pass), and its outcome committed at once where that claim still stands: two servers'
    overlapping passes never send one notification twice, whatever the loop's lease. Delivery is
    at least once: a process that dies between a send and its commit sends that one notification
    again after SENDING_RETRY_S, never silently drops it; nothing else is repeated. Each claim's
    time is read when it is made, and no new claim after SEND_BUDGET_S of the pass
    (corral.monitor.claiming), so a slow pass's claims never expire while it sends them."""
    mailer = Mailer(email_transport(config, settings.email_channel))
    claiming = ClaimingPass(now, SEND_BUDGET_S)
    handled = 0
    try:
        with session_factory() as session:
            for seen in due_messages(session, PageNotification, now, DELIVERY_BATCH):
                at = claiming.claim_time()
                if at is None:
                    break
                note = claim_message(session, PageNotification, seen, at, claimed_by=owner)
                if note is None:
                    continue
                claim_until = note.next_attempt_at
                if reclaimed_too_often(seen[1], note, config.retry.max_attempts):
                    give_up_reclaimed(note, at)
                else:
                    _handle(session, mailer, note, key, config, settings, at, claiming.at, webhook_networks)
                _store_outcome(session, note, owner, claim_until)
                handled += 1
            return handled
    finally:
        mailer.close()


PURGE_EVERY_S = 3600.0
_purged_at: dict[str, float] = {}  # per server process (owner id): when it last purged


def paging_tick(ctx: ServerContext, now: float) -> None:
    with ctx.session_factory() as session:
        advanced = escalate_due(session, now)
        if now - _purged_at.get(ctx.owner_id, 0.0) >= PURGE_EVERY_S:
            purge_ended(session, now - SETTINGS.keep_days * 86400.0)
            _purged_at[ctx.owner_id] = now
    networks = webhook_guard.parse_networks(ctx.settings.webhook_allow_networks)
    # the clock read again: escalating and purging take time, and a claim's expiry
    # (SENDING_RETRY_S) must count from when it is made
    handled = deliver_pages(
        ctx.session_factory,
        monitor_config(ctx),
        SETTINGS,
        link_key(ctx.settings),
        max(now, time.time()),
        networks,
        owner=ctx.owner_id,
    )
    if (
        handled >= DELIVERY_BATCH or advanced >= ESCALATE_BATCH
    ):  # more may be waiting: run again at once instead of next interval
        ctx.wake("paging")


SETTINGS = PagingSettings()
LOOPS: list[BackgroundLoop] = [BackgroundLoop("paging", SETTINGS.interval_s, paging_tick)]
