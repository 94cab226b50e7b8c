"""A job notification waiting for an address its owner took away (review #11): a contact method
removed, or the account's email changed, after the message was grouped (pending, or failing and
waiting out its backoff). Nothing more goes there: the message is given up at once, saying why,
on the job's `notify` events and its notifications; the owner's contacts of now get what follows.
And a webhook whose host's lookup hangs: given up at the send's deadline, then retried. The real
app, a real SMTP server and a real webhook receiver; SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest

from corral.monitor import pager
from corral.monitor.config import RetryPolicy
from corral.monitor.job_notifier import deliver
from corral.services import job_notify, webhook_guard
from tests.notify.conftest import LOOPBACK, Team
from tests.notify.test_job_notify import submit
from tests.notify.test_job_notify_robust import fail, notify_events
from tests.oncall.conftest import Smtp
from tests.webhook_server import WebhookServer

NETWORKS = webhook_guard.parse_networks(LOOPBACK)
GONE = "the {} address is no longer one of alice's contacts (removed or changed)"


@pytest.mark.parametrize("team", ["sqlite", "postgres"], indirect=True)
def test_a_removed_or_changed_contact_gets_none_of_the_messages_waiting_for_it(
    team: Team, smtp: Smtp, hook: WebhookServer
) -> None:
    hook.status = 500
    added = team.post("/users/alice/contacts", {"kind": "webhook", "address": hook.url})
    assert added.status_code == 201, added.text
    (method,) = added.json()["methods"]
    config = smtp.config().model_copy(update={"retry": RetryPolicy(initial_backoff=3600, max_attempts=5)})
    now = time.time()
    first, second = (
        submit(team, {"on": ["failed"]}, name="first"),
        submit(team, {"on": ["failed"]}, name="second"),
    )
    fail(team, [first], now)
    with team.factory() as db:
        assert job_notify.group_pending(db, now, base_url="http://corral.test") == 1
    assert (
        deliver(team.factory, config, now, NETWORKS) == 2
    )  # the email sent; the webhook failing, for an hour
    assert (smtp.inbox.to(), len(hook.posts)) == (["alice@example.org"], 1)
    fail(team, [second], now + 1)
    with team.factory() as db:
        assert (
            job_notify.group_pending(db, now + 61, base_url="http://corral.test") == 1
        )  # pending, both kinds
    removed = team.client.delete(
        f"/api/v1/users/alice/contacts/{method['id']}", headers=team.headers["alice"]
    )
    assert removed.status_code == 204, removed.text
    changed = team.client.put(
        "/api/v1/users/alice/email", json={"email": "new@example.org"}, headers=team.headers["alice"]
    )
    assert changed.status_code == 200, changed.text
    # the failing webhook is due at once (not in an hour), and each waiting message given up unsent
    assert deliver(team.factory, config, now + 62, NETWORKS) == 3
    assert (smtp.inbox.to(), len(hook.posts)) == (["alice@example.org"], 1)
    assert notify_events(team, first) == [
        "failed: notification sent by email",
        f"failed: notification by webhook given up after 2 attempts: {GONE.format('webhook')}",
    ]
    assert sorted(notify_events(team, second)) == [
        f"failed: notification by email given up after 1 attempt: {GONE.format('email')}",
        f"failed: notification by webhook given up after 1 attempt: {GONE.format('webhook')}",
    ]
    (shown,) = team.get(f"/jobs/{second}/notifications")
    assert {(d["kind"], d["state"], d["last_error"]) for d in shown["deliveries"]} == {
        ("email", "given_up", GONE.format("email")),
        ("webhook", "given_up", GONE.format("webhook")),
    }
    third = submit(team, {"on": ["failed"]}, name="third")  # what follows goes to the contacts of now
    fail(team, [third], now + 200)
    with team.factory() as db:
        assert job_notify.group_pending(db, now + 200, base_url="http://corral.test") == 1
    assert deliver(team.factory, config, now + 200, NETWORKS) == 1
    assert (smtp.inbox.to(), len(hook.posts)) == (["alice@example.org", "new@example.org"], 1)


def test_a_webhook_whose_name_does_not_resolve_in_time_is_given_up_at_the_deadline_and_retried(
    team: Team, smtp: Smtp, hook: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SSRF guard's lookup of the webhook's host is inside the send's deadline
    (pager.WEBHOOK_DEADLINE_S): a resolver that does not answer fails that try at the deadline
    (not holding the pass), and the message goes on its retry once names resolve again."""
    url = hook.url.replace("127.0.0.1", "localhost")
    assert team.post("/users/alice/contacts", {"kind": "webhook", "address": url}).status_code == 201
    monkeypatch.setattr(pager, "WEBHOOK_DEADLINE_S", 1.0)
    answers = threading.Event()
    real_resolve = webhook_guard.resolve

    def hanging_resolver(host: str, port: int) -> list[webhook_guard.Address]:
        answers.wait(10)  # a resolver that does not answer until the test lets it
        return real_resolve(host, port)

    monkeypatch.setattr(webhook_guard, "resolve", hanging_resolver)
    now = time.time()
    job_id = submit(team, {"on": ["failed"], "to": ["webhook"]})
    fail(team, [job_id], now)
    with team.factory() as db:
        assert job_notify.group_pending(db, now, base_url="http://corral.test") == 1
    started = time.monotonic()
    try:
        assert deliver(team.factory, smtp.config(), now, NETWORKS) == 1
        took = time.monotonic() - started
    finally:
        answers.set()
    assert 1.0 <= took < 3.0, took
    (note,) = team.get(f"/jobs/{job_id}/notifications")
    (shown,) = note["deliveries"]
    assert (shown["state"], shown["attempts"]) == ("failing", 1), shown
    assert shown["last_error"].endswith("no complete answer within 1 s"), shown
    assert hook.posts == []
    assert deliver(team.factory, smtp.config(), now + 5, NETWORKS) == 1  # after the 1 s backoff
    assert len(hook.posts) == 1
    assert notify_events(team, job_id) == ["failed: notification sent by webhook"]
