"""Page notifications claimed one at a time by compare-and-set, with a claimer and an expiry
(corral.monitor.pager): two servers' overlapping delivery passes on one database send each
notification once, and a pass whose claim expired (another server took the notification) does
not overwrite that server's outcome. A real SMTP server (aiosmtpd); PostgreSQL where two
connections race."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from corral.db.oncall_models import PageNotification
from corral.monitor import config, pager
from corral.monitor.claiming import SENDING_RETRY_S, claim_message, due_messages
from corral.monitor.pager import PagingSettings, deliver_pages
from corral.services import paging
from tests.oncall.conftest import Env, Inbox, Smtp, smtp_server
from tests.oncall.test_paging import contact, set_up, start

ADDRESSES = ["alice@example.org", "alice+1@example.org", "alice+2@example.org"]


def queue_three(env: Env, key: str, now: float) -> None:
    """A page whose first step reaches alice at her three addresses: three notifications due."""
    set_up(env)
    for address in ADDRESSES[1:]:
        assert contact(env, "alice", "email", address, as_user="alice").status_code == 201
    start(env, key, now)
    with env.factory() as db:
        paging.escalate_due(db, now)
        assert db.scalar(sa.select(sa.func.count()).select_from(PageNotification)) == 3


def page_due(env: Env, page_key: str, now: float) -> bytes:
    """A page whose first step reaches alice: one notification due. The links' key."""
    set_up(env)
    start(env, page_key, now)
    with env.factory() as db:
        paging.escalate_due(db, now)
    return paging.link_key(env.settings)


@pytest.mark.parametrize("env", ["postgres"], indirect=True)
def test_two_servers_delivering_at_once_send_each_page_notification_once(
    env: Env, smtp: Smtp, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    queue_three(env, "test:two", now)
    both_read = threading.Barrier(2)
    real_due = pager.due_messages

    def due_read_by_both(
        session: sa.orm.Session, model: type[PageNotification], at: float, limit: int
    ) -> list[tuple[int, str, float]]:
        rows = real_due(session, model, at, limit)
        both_read.wait(timeout=10)  # each server has read all three due before either claims one
        return rows

    monkeypatch.setattr(pager, "due_messages", due_read_by_both)
    handled: dict[str, int] = {}
    key = paging.link_key(env.settings)

    def server(owner: str) -> None:
        handled[owner] = deliver_pages(env.factory, smtp.config(), PagingSettings(), key, now, owner=owner)

    threads = [threading.Thread(target=server, args=(owner,)) for owner in ("server-a", "server-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sum(handled.values()) == 3, handled
    assert smtp.inbox.wait_for(3, 5)
    time.sleep(0.3)  # a duplicate, had there been one, would be in by now
    assert sorted(smtp.inbox.to()) == sorted(ADDRESSES)
    with env.factory() as db:
        rows = db.execute(sa.select(PageNotification.state, PageNotification.claimed_by)).all()
    assert [state for state, _ in rows] == ["sent"] * 3
    assert {owner for _, owner in rows} <= {"server-a", "server-b"}


def test_a_pass_whose_claim_expired_leaves_the_next_claimers_outcome(env: Env, smtp: Smtp) -> None:
    now = time.time()
    queue_three(env, "test:late", now)
    with env.factory() as db:
        seen = due_messages(db, PageNotification, now, pager.DELIVERY_BATCH)[0]
        # claimed, then stalls past its claim's expiry
        slow = claim_message(db, PageNotification, seen, now, claimed_by="server-a")
        assert slow is not None and slow.claimed_by == "server-a"
        claim_until = slow.next_attempt_at
        db.expunge(slow)
    later = now + SENDING_RETRY_S + 1
    key = paging.link_key(env.settings)
    assert deliver_pages(env.factory, smtp.config(), PagingSettings(), key, later, owner="server-b") == 3
    assert smtp.inbox.wait_for(3, 5)
    with env.factory() as db:
        slow = db.get(PageNotification, seen[0])
        assert slow is not None
        slow.state, slow.last_error = "failing", "the slow server's failure"
        pager._store_outcome(db, slow, "server-a", claim_until)
        row = db.get(PageNotification, seen[0], populate_existing=True)
        assert row is not None and (row.state, row.claimed_by, row.last_error) == ("sent", "server-b", "")


class SlowInbox(Inbox):
    """An SMTP server that takes SLOW_SEND_S over each message, as a loaded relay does."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        await asyncio.sleep(SLOW_SEND_S)
        return await super().handle_DATA(server, session, envelope)


SLOW_SEND_S = 2.0  # and a budget of 1.5 sends: half a send (1 s) of slack either way on a loaded box


@pytest.fixture
def slow_smtp() -> Iterator[Smtp]:
    with smtp_server(SlowInbox()) as server:
        yield server


def test_a_slow_pass_claims_each_notification_when_it_sends_it_and_stops_at_its_budget(
    env: Env, slow_smtp: Smtp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review109 #1: a claim's expiry counts from when it is made, not from the pass's start,
    and a pass makes no claim past its budget, so that no claim expires (and another server
    sends the notification too) while the pass is still busy with the ones before it."""
    monkeypatch.setattr(pager, "SEND_BUDGET_S", 1.5 * SLOW_SEND_S)
    now = time.time()
    queue_three(env, "test:slow", now)
    key = paging.link_key(env.settings)
    handled = deliver_pages(env.factory, slow_smtp.config(), PagingSettings(), key, now, owner="server-a")
    assert handled == 2  # the third was due after the budget: left for the next pass
    with env.factory() as db:
        rows = db.execute(
            sa.select(PageNotification.state, PageNotification.next_attempt_at).order_by(PageNotification.id)
        ).all()
    assert [state for state, _ in rows] == ["sent", "sent", "pending"]
    first_claim_until, second_claim_until = rows[0][1], rows[1][1]
    assert first_claim_until - now < SENDING_RETRY_S + SLOW_SEND_S
    assert second_claim_until - now >= SENDING_RETRY_S + SLOW_SEND_S  # claimed after the first send
    assert rows[2][1] == now  # not claimed: still due, as it was


def test_a_subject_with_line_breaks_is_mailed_on_one_line(env: Env, smtp: Smtp) -> None:
    """review109 #2: a page's subject may hold line breaks (an admin's, an alert rule's title);
    EmailMessage refuses them in a header, which left the notification `sending` for good."""
    now = time.time()
    set_up(env)
    with env.factory() as db:
        paging.start(
            db, key="test:lines", policy="gpu", subject="GPU 0 on node-a\r\nECC\nerrors", body="b", now=now
        )
        db.commit()
        paging.escalate_due(db, now)
    key = paging.link_key(env.settings)
    assert deliver_pages(env.factory, smtp.config(), PagingSettings(), key, now) == 1
    assert smtp.inbox.wait_for(1, 5)
    assert smtp.inbox.messages[0]["Subject"] == "[Corral page] GPU 0 on node-a ECC errors"
    with env.factory() as db:
        assert db.scalars(sa.select(PageNotification.state)).all() == ["sent"]


@pytest.mark.parametrize(
    "brk", ["\r", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
)
def test_every_line_break_the_email_policy_refuses_is_made_a_space(smtp: Smtp, brk: str) -> None:
    """review110 #3: EmailMessage refuses a header value that str.splitlines() splits, which is
    more than CR and LF; each such break in the subject and a header is mailed as a space."""
    assert len(f"a{brk}b".splitlines()) == 2  # the policy's own test: it would refuse this value
    mailer = pager.Mailer(pager.email_transport(smtp.config(), None))
    try:
        mailer.send_text("oncall@example.org", f"GPU 0{brk}Bcc: evil@x", "b", {"X-Corral-Page": f"k{brk}2"})
    finally:
        mailer.close()
    assert smtp.inbox.wait_for(1, 5)
    message = smtp.inbox.messages[0]
    assert (message["Subject"], message["X-Corral-Page"], message["Bcc"]) == (
        "GPU 0 Bcc: evil@x",
        "k 2",
        None,
    )


def test_an_unexpected_error_in_one_send_is_that_notifications_failure(
    env: Env, smtp: Smtp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review109 #2: any error of one send is recorded as that notification's failure (retried,
    then given up) and the pass goes on; it used to leave the row `sending` and end the pass."""
    now = time.time()
    queue_three(env, "test:bug", now)
    real_send = pager.Mailer.send

    def bug_for_one(mailer: pager.Mailer, out: pager.Outgoing) -> None:
        if out.note.address == ADDRESSES[1]:
            raise KeyError("a bug in one send")
        real_send(mailer, out)

    monkeypatch.setattr(pager.Mailer, "send", bug_for_one)
    key = paging.link_key(env.settings)
    assert deliver_pages(env.factory, smtp.config(), PagingSettings(), key, now) == 3
    assert smtp.inbox.wait_for(2, 5)
    with env.factory() as db:
        rows = db.execute(
            sa.select(PageNotification.address, PageNotification.state, PageNotification.last_error)
        ).all()
    assert sorted(rows) == sorted(
        [
            (ADDRESSES[0], "sent", ""),
            (ADDRESSES[1], "failing", "KeyError: 'a bug in one send'"),
            (ADDRESSES[2], "sent", ""),
        ]
    )


def test_a_notification_whose_sender_dies_each_time_is_given_up_at_the_retry_limit(
    env: Env, smtp: Smtp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review109 #2: a notification left `sending` by a process that died was claimed again
    after SENDING_RETRY_S for ever; those claims count against the retry limit, as job
    notifications' do."""
    now = time.time()
    key = page_due(env, "test:dies", now)

    def dies(mailer: pager.Mailer, out: pager.Outgoing) -> None:
        raise SystemExit("the server process goes away")

    monkeypatch.setattr(pager.Mailer, "send", dies)
    limit = smtp.config().retry.max_attempts
    at = now
    for _ in range(limit):
        with pytest.raises(SystemExit):
            deliver_pages(env.factory, smtp.config(), PagingSettings(), key, at)
        at += SENDING_RETRY_S + 1
    assert deliver_pages(env.factory, smtp.config(), PagingSettings(), key, at) == 1  # given up unsent
    with env.factory() as db:
        (row,) = db.scalars(sa.select(PageNotification))
        assert (row.state, row.last_error) == (
            "given_up",
            f"the server stopped while sending it, {limit} times",
        )
    assert deliver_pages(env.factory, smtp.config(), PagingSettings(), key, at + 1000) == 0
    assert smtp.inbox.to() == []


def test_messages_never_tried_are_claimed_before_retries(env: Env) -> None:
    """review110 #5: retries to dead endpoints (each up to its timeout) came first, oldest due
    first, and could use up a pass's claim budget before a fresh page was sent."""
    now = time.time()
    queue_three(env, "test:fresh", now)
    with env.factory() as db:
        ids = sorted(db.scalars(sa.select(PageNotification.id)))
        for offset, failing in zip((200.0, 100.0), ids[1:], strict=True):
            row = db.get(PageNotification, failing)
            assert row is not None
            row.state, row.attempts, row.next_attempt_at = "failing", 1, now - offset
        db.commit()
        due = due_messages(db, PageNotification, now, pager.DELIVERY_BATCH)
    fresh_first = [(ids[0], "pending"), (ids[1], "failing"), (ids[2], "failing")]
    assert [(i, state) for i, state, _ in due] == fresh_first


def test_a_notifications_sent_time_is_when_its_send_ended_not_its_claim(env: Env, slow_smtp: Smtp) -> None:
    """rough14 #1: a page notification's sent_at was its claim's time, a slow send's whole length
    early (the job notifier's was mended in review110 #11)."""
    now = time.time()
    key = page_due(env, "test:sent-at", now)
    assert deliver_pages(env.factory, slow_smtp.config(), PagingSettings(), key, now, owner="server-a") == 1
    with env.factory() as db:
        (sent_at,) = db.scalars(sa.select(PageNotification.sent_at))
    assert sent_at is not None and sent_at >= now + SLOW_SEND_S


LINE_DELAY_S = 0.25  # each line the server answers; a send is ten lines (greeting, EHLO's five, ...)


def test_one_email_send_ends_at_its_deadline_however_slowly_the_server_answers(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rough14 #2: the SMTP `timeout` bounds each socket operation only, so a server answering a
    line every LINE_DELAY_S (each well within it) stretched one send past its deadline, and past
    its claim. Here the deadline is one operation's timeout (1 s), the send 2.5 s of lines."""
    monkeypatch.setattr(config, "SMTP_SEND_OPERATIONS", 1)
    now = time.time()
    key = page_due(env, "test:deadline", now)
    with smtp_server(Inbox(), line_delay_s=LINE_DELAY_S) as slow:
        monitor = slow.config()
        monitor.channels[0].timeout = 1.0  # type: ignore[union-attr]
        started = time.monotonic()
        assert deliver_pages(env.factory, monitor, PagingSettings(), key, now, owner="server-a") == 1
        took = time.monotonic() - started
    assert took < 10 * LINE_DELAY_S  # stopped at the deadline, not at the end of the lines
    with env.factory() as db:
        (row,) = db.execute(sa.select(PageNotification.state, PageNotification.last_error)).all()
    assert row.state == "failing"
    assert row.last_error == (
        f"SMTP 127.0.0.1:{slow.port}: the send did not end within its 1 s deadline "
        "(the whole send's; the channel's timeout, 1 s, bounds each operation)"
    )
    assert slow.inbox.messages == []
