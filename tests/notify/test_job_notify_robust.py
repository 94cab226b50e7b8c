"""Job notifications under hostile or heavy input (review 107): a NUL in a webhook's answer or a
log, one user's bad row, two servers' overlapping passes, a flood of events, a deleted job, a
deactivated owner, Slack mentions, and a job opting out of its owner's default. The real app,
a real SMTP server and real HTTP receivers; SQLite, and PostgreSQL where the database decides."""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from corral.cli.main import app as cli
from corral.db.models import Job, User
from corral.db.notify_models import JobNotifyDelivery
from corral.monitor import job_notifier
from corral.monitor.claiming import SENDING_RETRY_S, claim_message, due_messages
from corral.monitor.job_notifier import deliver
from corral.services import job_notify, lifecycle, webhook_guard
from corral.services.lifecycle import JobState
from tests.notify.conftest import LOOPBACK, Team
from tests.notify.test_job_notify import body_of, notification_pass, outbox, run_and_end, submit
from tests.oncall.conftest import Smtp, smtp_server
from tests.oncall.test_page_delivery import SLOW_SEND_S, SlowInbox
from tests.support import served
from tests.webhook_server import WebhookServer

BOTH = pytest.mark.parametrize("team", ["sqlite", "postgres"], indirect=True)
NETWORKS = webhook_guard.parse_networks(LOOPBACK)


def fail(team: Team, job_ids: list[int], now: float, message: str = "x") -> None:
    with team.factory() as db:
        jobs = list(db.scalars(sa.select(Job).where(Job.id.in_(job_ids))))
        for job in jobs:
            assert lifecycle.transition(db, job, JobState.FAILED, now=now, message=message)
        db.commit()


def notify_events(team: Team, job_id: int) -> list[str]:
    return [e["message"] for e in team.get(f"/jobs/{job_id}/events") if e["kind"] == "notify"]


def give_bob_an_email(team: Team) -> None:
    email = team.client.put(
        "/api/v1/users/bob/email", json={"email": "bob@example.org"}, headers=team.headers["bob"]
    )
    assert email.status_code == 200, email.text


def answer_with_a_nul(hook: WebhookServer) -> None:
    """The receiver answers its error with a NUL in the body (`nopeoops\\x00`)."""
    base: Any = hook.server.RequestHandlerClass

    class NulAnswer(base):  # type: ignore[misc, valid-type]
        def do_POST(self) -> None:
            super().do_POST()
            self.wfile.write(b"oops\x00")

    hook.server.RequestHandlerClass = NulAnswer


@BOTH
def test_a_webhook_answering_a_nul_fails_alone_and_nothing_is_sent_twice(
    team: Team, smtp: Smtp, hook: WebhookServer
) -> None:
    """Finding 1: the error text is stored without its NUL (PostgreSQL refused it and the whole
    batch was sent again every 5 minutes); the mails of the same pass stand."""
    hook.status = 500
    answer_with_a_nul(hook)
    give_bob_an_email(team)
    assert team.post("/users/alice/contacts", {"kind": "webhook", "address": hook.url}).status_code == 201
    now = time.time()
    alices, bobs = submit(team, {"on": ["failed"]}), submit(team, {"on": ["failed"]}, user="bob")
    fail(team, [alices, bobs], now)
    assert notification_pass(team, smtp, now) == 3
    assert sorted(smtp.inbox.to()) == ["alice@example.org", "bob@example.org"]
    (note,) = team.get(f"/jobs/{alices}/notifications")
    webhook = next(d for d in note["deliveries"] if d["kind"] == "webhook")
    assert webhook["state"] == "failing" and "HTTP 500 nopeoops\ufffd" in webhook["last_error"]
    for later in (now + 301, now + 602):
        notification_pass(team, smtp, later)
    assert len(smtp.inbox.messages) == 2  # the mails were sent once
    (note,) = team.get(f"/jobs/{alices}/notifications")
    assert {d["kind"]: d["state"] for d in note["deliveries"]} == {"email": "sent", "webhook": "given_up"}
    assert any("given up after 2 attempts" in m and "\x00" not in m for m in notify_events(team, alices))


@BOTH
def test_a_nul_in_the_log_tail_is_replaced_and_the_mail_goes(team: Team, smtp: Smtp) -> None:
    """Finding 2: a failed job whose log holds a NUL (binary output) is told like any other."""
    now = time.time()
    job_id = submit(team, {"on": ["failed"]})
    fail(team, [job_id], now)
    with team.factory() as db:
        tail = "ok\nbinary\x00junk\x1b[0m\n"
        assert (
            job_notify.group_pending(db, now, base_url="http://corral.test", log_tail=lambda job: tail) == 1
        )
    assert deliver(team.factory, smtp.config(), now, NETWORKS) == 1
    assert outbox(team) == [(job_id, "failed", "grouped")]
    assert "binary\ufffdjunk\ufffd[0m" in body_of(smtp, 0)


def test_one_users_bad_row_never_holds_back_anothers(team: Team, smtp: Smtp) -> None:
    """Finding 2: an unexpected error while grouping one user's rows sets those aside (`failed`,
    the job told why) and the other users' messages still go, this pass and the next."""
    give_bob_an_email(team)
    now = time.time()
    alices, bobs = submit(team, {"on": ["failed"]}), submit(team, {"on": ["failed"]}, user="bob")
    fail(team, [alices, bobs], now)

    def tail(job: Job) -> str:
        if job.id == alices:
            raise RuntimeError("a log the reader cannot read")
        return "fine"

    with team.factory() as db:
        assert job_notify.group_pending(db, now, base_url="http://corral.test", log_tail=tail) == 1
    assert deliver(team.factory, smtp.config(), now, NETWORKS) == 1
    assert smtp.inbox.to() == ["bob@example.org"]
    assert sorted(outbox(team)) == sorted([(alices, "failed", "failed"), (bobs, "failed", "grouped")])
    assert notify_events(team, alices) == [
        "no notification of 'failed' sent: it could not be prepared (RuntimeError)"
    ]
    assert notification_pass(team, smtp, now + 120) == 0  # set aside: not read again


@BOTH
def test_two_overlapping_grouping_passes_tell_one_event_once(team: Team, smtp: Smtp) -> None:
    """Finding 4: another server's pass runs while this one reads the log; the rows are moved by
    compare-and-set, so only one pass makes a message of them."""
    now = time.time()
    job_id = submit(team, {"on": ["failed"]})
    fail(team, [job_id], now)
    other: list[int] = []

    def tail_read_while_another_pass_runs(job: Job) -> str:
        with team.factory() as db:  # the other server: its own session
            other.append(job_notify.group_pending(db, now, base_url="http://corral.test"))
        return "log"

    with team.factory() as db:
        first = job_notify.group_pending(
            db, now, base_url="http://corral.test", log_tail=tail_read_while_another_pass_runs
        )
    assert (first, other) == (0, [1])
    assert deliver(team.factory, smtp.config(), now, NETWORKS) == 1
    assert smtp.inbox.to() == ["alice@example.org"]


@BOTH
def test_a_claimed_message_is_sent_by_one_pass_only(team: Team, smtp: Smtp) -> None:
    """Finding 4: two passes that read the same due message both try to claim it; the claim is a
    compare-and-set on its state and due time, so one wins and the other skips it."""
    now = time.time()
    fail(team, [submit(team, {"on": ["failed"]})], now)
    with team.factory() as db:
        job_notify.group_pending(db, now, base_url="http://corral.test")
    with team.factory() as one, team.factory() as two:
        (seen,) = due_messages(one, JobNotifyDelivery, now, 200)
        assert due_messages(two, JobNotifyDelivery, now, 200) == [seen]
        won = claim_message(one, JobNotifyDelivery, seen, now)
        assert won is not None and won.state == "sending" and won.attempts == 1
        assert claim_message(two, JobNotifyDelivery, seen, now) is None
    assert deliver(team.factory, smtp.config(), now + 1, NETWORKS) == 0  # claimed: not due again yet
    assert smtp.inbox.messages == []


def test_a_pass_whose_claim_expired_leaves_the_next_claimers_outcome(team: Team, smtp: Smtp) -> None:
    """review110 #5: a pass so slow that its claim expired and another pass took the message
    over (and sent it) stores neither its outcome nor its jobs' events over that pass's."""
    now = time.time()
    (job_id,) = [submit(team, {"on": ["failed"]})]
    fail(team, [job_id], now)
    with team.factory() as db:
        job_notify.group_pending(db, now, base_url="http://corral.test")
        (seen,) = due_messages(db, JobNotifyDelivery, now, 200)
        slow = claim_message(db, JobNotifyDelivery, seen, now)  # then stalls past its claim's expiry
        assert slow is not None
        claim_until = slow.next_attempt_at
        db.expunge(slow)
    assert deliver(team.factory, smtp.config(), now + SENDING_RETRY_S + 1, NETWORKS) == 1
    assert smtp.inbox.wait_for(1, 5)
    sent_events = notify_events(team, job_id)
    assert len(sent_events) == 1
    for state in ("failing", "given_up"):
        with team.factory() as db:
            late = db.get(JobNotifyDelivery, seen[0])
            assert late is not None
            late.state, late.last_error = state, "the slow pass's failure"
            job_notifier._store_outcome(db, late, claim_until, now)
            row = db.get(JobNotifyDelivery, seen[0], populate_existing=True)
            assert row is not None and (row.state, row.last_error, row.attempts) == ("sent", "", 2)
    assert notify_events(team, job_id) == sent_events


@BOTH
def test_a_flood_is_caught_up_in_one_digest_listing_some_and_counting_all(
    team: Team, smtp: Smtp, hook: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 5: however many events wait, a due user's are all grouped at once; the text lists
    DIGEST_MAX_LINES and counts the rest, and the webhook's JSON carries no more than it lists."""
    monkeypatch.setattr(job_notify, "DIGEST_MAX_LINES", 4)
    monkeypatch.setattr(job_notify, "GROUP_BATCH", 5, raising=False)  # the old per-pass cap
    assert team.post("/users/alice/contacts", {"kind": "webhook", "address": hook.url}).status_code == 201
    now = time.time()
    flood = [submit(team, {"on": ["end"]}, name=f"trial-{i}") for i in range(12)]
    with team.factory() as db:
        jobs = list(db.scalars(sa.select(Job).where(Job.id.in_(flood))))
        assert lifecycle.transition_jobs(db, jobs[:9], JobState.FAILED, now=now) == set(flood[:9])
        assert lifecycle.transition_jobs(db, jobs[9:], JobState.CANCELLED, now=now) == set(flood[9:])
        db.commit()
    assert notification_pass(team, smtp, now) == 2  # one mail, one webhook post
    assert {state for _, _, state in outbox(team)} == {"grouped"}
    assert smtp.inbox.messages[0]["Subject"] == "[Corral] 12 job notifications: 9 failed, 3 cancelled"
    body = body_of(smtp, 0)
    assert body.count("\n- job ") == 4 and "... and 8 more (corral ls)" in body
    (posted,) = hook.bodies
    assert (posted["count"], posted["omitted"], len(posted["notifications"])) == (12, 8, 4)
    # every job's events say its message went, listed or counted
    assert all(notify_events(team, j) == ["failed: notification sent by email (one message for 12 events)",
                                          "failed: notification sent by webhook (one message for 12 events)"]
               for j in flood[:9])  # fmt: skip


def test_a_started_item_shows_the_reason_of_its_own_moment(team: Team, smtp: Smtp) -> None:
    """Finding 11: a start has no words of its own; it never shows the job's later failure."""
    now = time.time()
    job_id = submit(team, {"on": ["all"]})
    run_and_end(team, job_id, "failed", now)
    assert notification_pass(team, smtp, now) == 1
    body = body_of(smtp, 0)
    assert f"- job {job_id} train started (http://corral.test/jobs/{job_id})" in body
    assert f"- job {job_id} train failed: attempt 1 failed (exit code 1)" in body


@BOTH
def test_a_settled_message_keeps_no_log_and_a_deleted_jobs_messages_go(team: Team, smtp: Smtp) -> None:
    """Finding 14: once sent, a message's text (with the log tail) is dropped; a message of a job
    deleted before it went is deleted by the next purge, whatever its age."""
    now = time.time()
    sent, deleted = (
        submit(team, {"on": ["failed"]}, name="sent"),
        submit(team, {"on": ["failed"]}, name="gone"),
    )
    fail(team, [sent], now)
    assert notification_pass(team, smtp, now) == 1
    assert "Last lines of its log" in body_of(smtp, 0)
    fail(team, [deleted], now + 1)
    with team.factory() as db:
        job_notify.group_pending(
            db, now + 120, base_url="http://corral.test", log_tail=lambda job: "secret=1"
        )
        stored = {d.subject: d for d in db.scalars(sa.select(JobNotifyDelivery))}
        assert stored[f"[Corral] job {sent} sent failed"].body == ""
        assert "notifications" not in stored[f"[Corral] job {sent} sent failed"].payload
        assert "secret=1" in stored[f"[Corral] job {deleted} gone failed"].body  # not sent yet
        db.execute(sa.delete(Job).where(Job.id == deleted))  # as a job's purge does
        db.commit()
        assert job_notify.purge_settled(db, now - 86400) == 1  # too young to go by age; orphaned
        assert [d.subject for d in db.scalars(sa.select(JobNotifyDelivery))] == [
            f"[Corral] job {sent} sent failed"
        ]


def test_a_deactivated_owner_is_told_of_as_such_and_their_waiting_message_given_up(
    team: Team, smtp: Smtp
) -> None:
    """Finding 17: not "has no contact"; and a message grouped before the deactivation is not sent."""
    now = time.time()
    before, after = (
        submit(team, {"on": ["failed"]}, name="before"),
        submit(team, {"on": ["failed"]}, name="after"),
    )
    fail(team, [before], now)
    with team.factory() as db:
        job_notify.group_pending(db, now, base_url="http://corral.test")
        alice = db.scalar(sa.select(User).where(User.name == "alice"))
        assert alice is not None
        alice.active = False
        db.commit()
    fail(team, [after], now + 1)
    assert notification_pass(team, smtp, now + 120) == 1  # handled: given up, not sent
    assert smtp.inbox.messages == []
    assert notify_events(team, before) == [
        "failed: notification by email given up after 1 attempt: alice's account is deactivated"
    ]
    assert notify_events(team, after) == ["no notification of 'failed' sent: alice's account is deactivated"]


def test_slack_text_mentions_and_links_are_shown_not_acted_on(
    team: Team, smtp: Smtp, hook: WebhookServer
) -> None:
    """Finding 20: a reason (or a log line) cannot ping a channel or disguise a link in Slack."""
    assert team.post("/users/alice/contacts", {"kind": "slack", "address": hook.url}).status_code == 201
    now = time.time()
    job_id = submit(team, {"on": ["failed"], "to": ["slack"]})
    fail(team, [job_id], now, message="<!channel> @here see <http://evil|docs> & more x.@channel @here_ @bob")
    assert notification_pass(team, smtp, now) == 1
    (posted,) = hook.bodies
    text = posted["text"]
    assert "&lt;!channel&gt; @\u200bhere see &lt;http://evil|docs&gt; &amp; more" in text
    assert "<" not in text and "@here" not in text
    assert "x.@\u200bchannel @\u200bhere_ @\u200bbob" in text and "@channel" not in text  # review108 #7


def test_a_job_opts_out_of_its_owners_default(team: Team, smtp: Smtp) -> None:
    """Finding 21: `notify: false` and `notify: {on: []}` are kept (the default does not replace
    them) and tell nothing; a job without `notify` gets the default."""
    put = team.client.put(
        "/api/v1/users/alice/job-notify", json={"notify": {"on": ["failed"]}}, headers=team.headers["alice"]
    )
    assert put.status_code == 200, put.text
    off = submit(team, False, name="off")  # type: ignore[arg-type]
    empty = submit(team, {"on": []}, name="empty")
    defaulted = submit(team, None, name="defaulted")
    assert team.get(f"/jobs/{off}")["spec"]["notify"] == {"on": [], "to": []}
    assert team.get(f"/jobs/{empty}")["spec"]["notify"] == {"on": [], "to": []}
    now = time.time()
    fail(team, [off, empty, defaulted], now)
    assert outbox(team) == [(defaulted, "failed", "pending")]
    token = team.headers["alice"]["Authorization"].split()[1]
    with served(team.client.app) as url:
        shown = CliRunner().invoke(cli, ["show", str(off)], env={"CORRAL_URL": url, "CORRAL_TOKEN": token})
    assert shown.exit_code == 0, shown.output
    assert "notify: nothing (the spec opts out of its owner's default)" in shown.output


def test_the_default_command_refuses_options_it_would_ignore(team: Team) -> None:
    """Finding 16: `--to` without `--on`, and `--off` with `--on`/`--to`, are refused, not ignored."""
    token = team.headers["alice"]["Authorization"].split()[1]
    with served(team.client.app) as url:
        env = {"CORRAL_URL": url, "CORRAL_TOKEN": token}
        for args, words in (
            (["--to", "email"], "give --on EVENTS with --to"),
            (["--off", "--on", "failed"], "--off takes no --on or --to"),
            (["--off", "--to", "email"], "--off takes no --on or --to"),
        ):
            result = CliRunner().invoke(cli, ["oncall", "contact", "notify", "alice", *args], env=env)
            assert result.exit_code == 2 and words in result.output, result.output
        shown = CliRunner().invoke(cli, ["oncall", "contact", "notify", "alice"], env=env)
    assert shown.exit_code == 0 and "alice: no job notification default" in shown.output, shown.output


@BOTH
def test_a_crash_mid_pass_resends_only_the_message_in_flight(
    team: Team, smtp: Smtp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 6: each outcome is committed as it settles, so a process dying after the first of
    two sends resends only the second (300 s later), not the whole batch; an unexpected error
    in one send is that message's failure, not the pass's."""
    give_bob_an_email(team)
    now = time.time()
    fail(team, [submit(team, {"on": ["failed"]}), submit(team, {"on": ["failed"]}, user="bob")], now)
    with team.factory() as db:
        assert job_notify.group_pending(db, now, base_url="http://corral.test") == 2
    real_send, calls = job_notifier._send, []

    def dies_at_the_second(mailer: Any, delivery: JobNotifyDelivery, allowed: Any) -> None:
        calls.append(delivery.address)
        if len(calls) == 2:
            raise SystemExit("the server process goes away")
        real_send(mailer, delivery, allowed)

    monkeypatch.setattr(job_notifier, "_send", dies_at_the_second)
    with pytest.raises(SystemExit):
        deliver(team.factory, smtp.config(), now, NETWORKS)
    monkeypatch.setattr(job_notifier, "_send", real_send)
    assert smtp.inbox.to() == [calls[0]]
    assert deliver(team.factory, smtp.config(), now + 10, NETWORKS) == 0  # still claimed
    assert deliver(team.factory, smtp.config(), now + 301, NETWORKS) == 1
    assert smtp.inbox.to() == calls  # each sent once

    def unexpected(mailer: Any, delivery: JobNotifyDelivery, allowed: Any) -> None:
        raise KeyError("a bug in one send")

    fail(team, [submit(team, {"on": ["failed"]}, name="later")], now + 400)
    monkeypatch.setattr(job_notifier, "_send", unexpected)
    with team.factory() as db:
        assert job_notify.group_pending(db, now + 400, base_url="http://corral.test") == 1
    assert deliver(team.factory, smtp.config(), now + 400, NETWORKS) == 1
    with team.factory() as db:
        failing = db.scalar(sa.select(JobNotifyDelivery).where(JobNotifyDelivery.state == "failing"))
        assert failing is not None and failing.last_error == "KeyError: 'a bug in one send'"


def test_a_message_whose_sender_dies_each_time_is_given_up_at_the_retry_limit(
    team: Team, smtp: Smtp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review108 #6: a message left in `sending` by a process that died was claimed again after
    SENDING_RETRY_S for ever; those claims count against the retry limit too."""
    now = time.time()
    fail(team, [submit(team, {"on": ["failed"]})], now)
    with team.factory() as db:
        assert job_notify.group_pending(db, now, base_url="http://corral.test") == 1

    def dies(mailer: Any, delivery: JobNotifyDelivery, allowed: Any) -> None:
        raise SystemExit("the server process goes away")

    monkeypatch.setattr(job_notifier, "_send", dies)
    limit = smtp.config().retry.max_attempts
    at = now
    for _ in range(limit):
        with pytest.raises(SystemExit):
            deliver(team.factory, smtp.config(), at, NETWORKS)
        at += SENDING_RETRY_S + 1
    assert deliver(team.factory, smtp.config(), at, NETWORKS) == 1  # claimed, and given up unsent
    with team.factory() as db:
        (row,) = db.scalars(sa.select(JobNotifyDelivery))
        assert (
            row.state == "given_up"
            and row.last_error == f"the server stopped while sending it, {limit} times"
        )
    assert deliver(team.factory, smtp.config(), at + 1000, NETWORKS) == 0 and smtp.inbox.to() == []


def refuse_job_events(team: Team) -> None:
    """The database refuses every new job event from now on (a trigger): the commit of a message's
    outcome, which writes its jobs' `notify` events, fails, as on a full disk or a lost lock."""
    with team.engine.begin() as conn:
        if team.engine.dialect.name == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER no_events BEFORE INSERT ON job_events"
                " BEGIN SELECT RAISE(ABORT, 'no room'); END"
            )
        else:
            conn.exec_driver_sql(
                "CREATE FUNCTION no_room() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'no room'; END $$"
                " LANGUAGE plpgsql"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER no_events BEFORE INSERT ON job_events FOR EACH ROW EXECUTE FUNCTION no_room()"
            )


@BOTH
def test_a_settled_outcome_written_by_the_fallback_keeps_no_text(team: Team, smtp: Smtp) -> None:
    """review #5: when the outcome's commit fails, the fallback write settles the message as the
    normal path does: sent, never sent again, and its body (with the log tail) and items gone."""
    now = time.time()
    fail(team, [submit(team, {"on": ["failed"]})], now)
    with team.factory() as db:
        job_notify.group_pending(db, now, base_url="http://corral.test", log_tail=lambda job: "secret=1")
    refuse_job_events(team)
    assert deliver(team.factory, smtp.config(), now, NETWORKS) == 1
    assert "secret=1" in body_of(smtp, 0)
    with team.factory() as db:
        (row,) = db.scalars(sa.select(JobNotifyDelivery))
        assert (row.state, row.body, row.last_error) == ("sent", "", "")
        assert "notifications" not in row.payload and row.payload["count"] == 1
    assert deliver(team.factory, smtp.config(), now + 1000, NETWORKS) == 0 and len(smtp.inbox.messages) == 1


def test_a_messages_sent_time_is_when_its_send_ended_not_its_claim(team: Team) -> None:
    """review110 #11: sent_at (and a failure's backoff) were the claim's time, a slow send's
    whole length early."""
    with smtp_server(SlowInbox()) as slow:
        now = time.time()
        job_id = submit(team, {"on": ["failed"]})
        fail(team, [job_id], now)
        assert notification_pass(team, slow, now) == 1
        assert slow.inbox.to() == ["alice@example.org"]
    with team.factory() as db:
        (sent_at,) = db.scalars(sa.select(JobNotifyDelivery.sent_at))
    assert sent_at is not None and sent_at >= now + SLOW_SEND_S
