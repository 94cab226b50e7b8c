"""Job notifications in process: jobs submitted through the real API, moved by the lifecycle's
own functions (as the control loops move them), and the notification loop's two steps (grouping,
delivery) run against a real SMTP server (aiosmtpd) and a real HTTP webhook receiver."""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from corral.cli.main import app as cli
from corral.db.diag_models import AttemptDiagnosis
from corral.db.models import Attempt, Job
from corral.db.notify_models import JobNotification
from corral.db.session import make_engine, make_session_factory
from corral.monitor.job_notifier import deliver
from corral.services import job_notify, lifecycle, webhook_guard
from corral.services.lifecycle import JobState
from tests.notify.conftest import LOOPBACK, Team
from tests.oncall.conftest import Smtp
from tests.support import served
from tests.webhook_server import WebhookServer

JOB: dict[str, Any] = {
    "name": "train",
    "command": "python train.py",
    "resources": {"cpus": 1, "memory": "256MiB"},
}
LOG = "\n".join(f"step {i}" for i in range(100)) + "\nRuntimeError: CUDA out of memory\n"


def submit(team: Team, notify: dict[str, Any] | None, *, name: str = "train", user: str = "alice") -> int:
    spec = {**JOB, "name": name, **({"notify": notify} if notify is not None else {})}
    response = team.post("/jobs", spec, as_user=user)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def run_and_end(team: Team, job_id: int, ending: str, now: float) -> None:
    """Place, start and end the job as the loops do: the schedule's batch, the start, then the
    failure rule (retries 0: FAILED) or success, with an hour's run on 2 GPUs and (a failure)
    the exit-spec's diagnosis."""
    with team.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        assert lifecycle.schedule_jobs(db, [job], now=now - 3600, messages={}) == {job_id: 1}
        assert lifecycle.transition(db, job, JobState.STARTING, now=now - 3600)
        assert lifecycle.transition(db, job, JobState.RUNNING, now=now - 3600)
        attempt = Attempt(
            job_id=job_id, number=1, state="failed" if ending == "failed" else "succeeded",
            created_at=now - 3600, started_at=now - 3600, ended_at=now, message="", placement=[],
        )  # fmt: skip
        db.add(attempt)
        job.attained_gpu_seconds = 2 * 3600.0
        db.flush()
        if ending == "failed":
            db.add(
                AttemptDiagnosis(
                    attempt_pk=attempt.id, job_id=job_id, reason="cuda_oom", category="user",
                    message="the GPU ran out of memory", fix="lower the batch size", evidence="", node="",
                    user_name="alice", at=now,
                )
            )  # fmt: skip
            assert lifecycle.settle_failure(db, job, why="attempt 1 failed (exit code 1)", now=now)
        else:
            assert lifecycle.transition(db, job, JobState.SUCCEEDED, now=now)
        db.commit()


def notification_pass(team: Team, smtp: Smtp, now: float) -> int:
    """One pass of the loop: group the outbox, send what is due. Returns how many were sent."""
    with team.factory() as db:
        job_notify.group_pending(db, now, base_url="http://corral.test", log_tail=lambda job: LOG)
    return deliver(team.factory, smtp.config(), now, webhook_guard.parse_networks(LOOPBACK))


def outbox(team: Team) -> list[tuple[int, str, str]]:
    with team.factory() as db:
        rows = db.execute(sa.select(JobNotification.job_id, JobNotification.event, JobNotification.state))
        return [(int(j), str(e), str(s)) for j, e, s in rows]


def body_of(smtp: Smtp, index: int) -> str:
    return smtp.inbox.messages[index].get_payload(decode=True).decode()  # type: ignore[union-attr]


@pytest.mark.parametrize("team", ["sqlite", "postgres"], indirect=True)
def test_a_failed_job_mails_its_owner_once_with_reason_fix_runtime_and_log(team: Team, smtp: Smtp) -> None:
    now = time.time()
    job_id = submit(team, {"on": ["fail"]})
    run_and_end(team, job_id, "failed", now)
    assert outbox(team) == [(job_id, "failed", "pending")]  # written with the transition
    assert notification_pass(team, smtp, now) == 1
    assert smtp.inbox.to() == ["alice@example.org"]
    message = smtp.inbox.messages[0]
    assert message["Subject"] == f"[Corral] job {job_id} train failed"
    body = body_of(smtp, 0)
    assert "Reason: attempt 1 failed (exit code 1)" in body
    assert (
        "Diagnosis: cuda_oom (user): the GPU ran out of memory" in body
        and "Fix: lower the batch size" in body
    )
    assert "Runtime: 3600s; GPU-hours: 2.0" in body
    assert f"Job: http://corral.test/jobs/{job_id}" in body
    tail = body.split("Last lines of its log")[1].splitlines()[1:]
    assert tail[-1] == "RuntimeError: CUDA out of memory" and len(tail) == job_notify.LOG_TAIL_LINES
    # later passes send nothing more; the job's events and its notifications say what went
    assert notification_pass(team, smtp, now + 120) == 0
    assert len(smtp.inbox.messages) == 1
    events = team.get(f"/jobs/{job_id}/events")
    assert [e["message"] for e in events if e["kind"] == "notify"] == ["failed: notification sent by email"]
    (note,) = team.get(f"/jobs/{job_id}/notifications")
    assert note["event"] == "failed" and note["state"] == "grouped"
    assert [(d["kind"], d["address"], d["state"]) for d in note["deliveries"]] == [
        ("email", "alice@example.org", "sent")
    ]
    # bob (same group) may see the job, not where alice's mail goes
    (seen_by_bob,) = team.get(f"/jobs/{job_id}/notifications", as_user="bob")
    assert seen_by_bob["deliveries"][0]["address"] is None


def test_success_with_on_end_posts_one_webhook_and_no_mail(
    team: Team, smtp: Smtp, hook: WebhookServer
) -> None:
    added = team.post("/users/alice/contacts", {"kind": "webhook", "address": f"{hook.url}/corral"})
    assert added.status_code == 201, added.text
    now = time.time()
    job_id = submit(team, {"on": ["end"], "to": ["webhook"]})
    run_and_end(team, job_id, "succeeded", now)
    assert notification_pass(team, smtp, now) == 1
    assert smtp.inbox.messages == []  # `to: [webhook]`: not her email
    ((path, body),) = hook.posts
    assert path == "/corral" and body["event"] == "job_notification" and body["count"] == 1
    (item,) = body["notifications"]
    assert (item["job_id"], item["event"], item["state"]) == (job_id, "succeeded", "succeeded")
    assert item["gpu_hours"] == 2.0 and item["url"] == f"http://corral.test/jobs/{job_id}"
    assert "log_tail" not in item  # only a failure carries its log


def test_a_job_without_notify_sends_nothing(team: Team, smtp: Smtp) -> None:
    now = time.time()
    job_id = submit(team, None)
    run_and_end(team, job_id, "failed", now)
    assert outbox(team) == []
    assert notification_pass(team, smtp, now) == 0
    assert smtp.inbox.messages == []


def test_started_and_cancelled_through_the_api(team: Team, smtp: Smtp) -> None:
    """`on: [started]` does not tell of the end; a queued job cancelled over the API tells `cancelled`
    when asked for (the API's cancel moves it by the same compare-and-set)."""
    quiet = submit(team, {"on": ["started"]}, name="quiet")
    told = submit(team, {"on": ["cancelled"]}, name="told")
    for job_id in (quiet, told):
        response = team.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=team.headers["alice"])
        assert response.status_code == 200, response.text
    assert outbox(team) == [(told, "cancelled", "pending")]
    assert notification_pass(team, smtp, time.time()) == 1
    assert smtp.inbox.messages[0]["Subject"] == f"[Corral] job {told} told cancelled"


@pytest.mark.parametrize("team", ["sqlite", "postgres"], indirect=True)
def test_a_restart_between_the_transition_and_the_send_still_sends_exactly_one(
    team: Team, smtp: Smtp
) -> None:
    now = time.time()
    job_id = submit(team, {"on": ["failed"]})
    run_and_end(team, job_id, "failed", now)
    with team.factory() as db:  # a transition retried on a stale copy loses its race: no second row
        stale = db.get(Job, job_id)
        assert stale is not None
        stale.state = JobState.RUNNING.value  # the copy as read before the first commit
        assert lifecycle.settle_failure(db, stale, why="again", now=now) is None
        db.commit()
    team.engine.dispose()  # the server goes away before its loop ran; a new one starts
    restarted = make_session_factory(make_engine(team.url))
    team.factory = restarted
    assert outbox(team) == [(job_id, "failed", "pending")]
    assert notification_pass(team, smtp, now + 5) == 1
    assert notification_pass(team, smtp, now + 500) == 0  # sent is settled: never again
    assert len(smtp.inbox.messages) == 1


@pytest.mark.parametrize("team", ["sqlite", "postgres"], indirect=True)
def test_a_burst_of_failures_is_one_message_a_minute(team: Team, smtp: Smtp) -> None:
    """The rate rule: at most one message per user per minute; what comes meanwhile waits and goes
    as one digest. 30 failures at once (one batch transition), then 10 more: two mails, not 40."""
    now = time.time()
    first = [submit(team, {"on": ["failed"]}, name=f"trial-{i}") for i in range(30)]
    with team.factory() as db:
        jobs = list(db.scalars(sa.select(Job).where(Job.id.in_(first))))
        assert lifecycle.transition_jobs(db, jobs, JobState.FAILED, now=now) == set(first)
        db.commit()
    assert notification_pass(team, smtp, now) == 1
    assert smtp.inbox.messages[0]["Subject"] == "[Corral] 30 job notifications: 30 failed"
    assert body_of(smtp, 0).count("\n- job ") == 30
    later = [submit(team, {"on": ["failed"]}, name=f"late-{i}") for i in range(10)]
    with team.factory() as db:
        jobs = list(db.scalars(sa.select(Job).where(Job.id.in_(later))))
        assert lifecycle.transition_jobs(db, jobs, JobState.FAILED, now=now + 10) == set(later)
        db.commit()
    assert notification_pass(team, smtp, now + 20) == 0  # inside alice's minute: they wait
    assert len(smtp.inbox.messages) == 1
    assert notification_pass(team, smtp, now + job_notify.DIGEST_WINDOW_S + 1) == 1
    assert smtp.inbox.messages[1]["Subject"] == "[Corral] 10 job notifications: 10 failed"
    assert len(smtp.inbox.messages) == 2
    assert {state for _, _, state in outbox(team)} == {"grouped"}


def test_no_contact_of_the_kind_is_recorded_not_sent(team: Team, smtp: Smtp) -> None:
    now = time.time()
    job_id = submit(team, {"on": ["failed"], "to": ["slack"]})
    with team.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None and lifecycle.transition(db, job, JobState.FAILED, now=now, message="gave up")
        db.commit()
    assert notification_pass(team, smtp, now) == 0
    assert outbox(team) == [(job_id, "failed", "no_contact")]
    notes = [e["message"] for e in team.get(f"/jobs/{job_id}/events") if e["kind"] == "notify"]
    assert notes == ["no notification of 'failed' sent: alice has no contact of kind slack"]


def test_a_failing_webhook_is_retried_then_given_up_and_the_job_says_so(
    team: Team, smtp: Smtp, hook: WebhookServer
) -> None:
    hook.status = 500
    assert team.post("/users/alice/contacts", {"kind": "webhook", "address": hook.url}).status_code == 201
    now = time.time()
    job_id = submit(team, {"on": ["failed"], "to": ["webhook"]})
    with team.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None and lifecycle.transition(db, job, JobState.FAILED, now=now, message="x")
        db.commit()
    assert notification_pass(team, smtp, now) == 1
    (note,) = team.get(f"/jobs/{job_id}/notifications")
    assert note["deliveries"][0]["state"] == "failing" and "HTTP 500" in note["deliveries"][0]["last_error"]
    assert notification_pass(team, smtp, now + 0.5) == 0  # backoff: not before 1 s
    assert notification_pass(team, smtp, now + 5) == 1  # the second and last attempt (max_attempts 2)
    assert len(hook.posts) == 2
    (note,) = team.get(f"/jobs/{job_id}/notifications")
    assert note["deliveries"][0]["state"] == "given_up"
    notes = [e["message"] for e in team.get(f"/jobs/{job_id}/events") if e["kind"] == "notify"]
    assert len(notes) == 1 and notes[0].startswith(
        "failed: notification by webhook given up after 2 attempts"
    )
    assert notification_pass(team, smtp, now + 500) == 0


def test_a_bad_notify_field_is_a_422_naming_it(team: Team) -> None:
    for notify, field, words in (
        ({"on": ["sometimes"]}, "on", "'sometimes' is not a notification event"),
        ({"on": ["failed"], "to": ["ops@example.org"]}, "to", "'email', 'webhook' or 'slack'"),
        ({"on": ["failed"], "cc": "x"}, "cc", "unknown field 'cc'"),
    ):
        response = team.post("/jobs", {**JOB, "notify": notify})
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        assert any(field in map(str, d["loc"]) and "notify" in map(str, d["loc"]) for d in detail), detail
        assert words in response.text, response.text
    assert outbox(team) == []


@pytest.mark.parametrize("team", ["sqlite", "postgres"], indirect=True)
def test_started_and_requeued_each_attempt_but_not_a_placement_that_fell_through(
    team: Team, smtp: Smtp
) -> None:
    """`started` at each attempt's start; `requeued` after work began (a preemption), not when a
    placement goes back to the queue before it started. Pending together, they go as one digest."""
    now = time.time()
    job_id = submit(team, {"on": ["BEGIN", "requeue"]})
    with team.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        assert lifecycle.schedule_jobs(db, [job], now=now, messages={})
        assert lifecycle.transition(db, job, JobState.QUEUED, now=now, message="its node went away")
        assert lifecycle.schedule_jobs(db, [job], now=now, messages={})
        for state in (JobState.STARTING, JobState.RUNNING, JobState.PREEMPTED):
            assert lifecycle.transition(db, job, state, now=now, message="reclaimed by group nlp")
        assert lifecycle.transition(db, job, JobState.QUEUED, now=now, message="reclaimed; back in the queue")
        assert lifecycle.schedule_jobs(db, [job], now=now, messages={})
        assert lifecycle.transition(db, job, JobState.STARTING, now=now)
        assert lifecycle.transition_jobs(db, [job], JobState.RUNNING, now=now) == {job_id}
        db.commit()
        attempts = [a for (a,) in db.execute(sa.select(JobNotification.attempt).order_by(JobNotification.id))]
    assert outbox(team) == [(job_id, e, "pending") for e in ("started", "requeued", "started")]
    assert attempts == [2, 2, 3]
    assert notification_pass(team, smtp, now) == 1
    assert smtp.inbox.messages[0]["Subject"] == "[Corral] 3 job notifications: 2 started, 1 requeued"
    assert f"job {job_id} train requeued: reclaimed; back in the queue" in body_of(smtp, 0)


def test_a_users_default_applies_to_jobs_without_notify(team: Team, smtp: Smtp) -> None:
    """`corral oncall contact notify alice --on failed`: her jobs without `notify` get it; a spec's
    own `notify` wins; only she and admins may set it; `--off` clears it for jobs from then on."""
    token = team.headers["alice"]["Authorization"].split()[1]
    with served(team.client.app) as url:
        env = {"CORRAL_URL": url, "CORRAL_TOKEN": token}
        shown = CliRunner().invoke(cli, ["oncall", "contact", "notify", "alice", "--on", "fail"], env=env)
        assert shown.exit_code == 0, shown.output
        assert "alice: jobs without notify tell of failed to all contacts" in shown.output
        refused = CliRunner().invoke(cli, ["oncall", "contact", "notify", "bob", "--on", "end"], env=env)
        assert refused.exit_code != 0 and "only bob and admins" in refused.output, refused.output
    bad = team.client.put(
        "/api/v1/users/alice/job-notify", json={"notify": {"on": ["x"]}}, headers=team.headers["alice"]
    )
    assert bad.status_code == 422 and "'x' is not a notification event" in bad.text
    empty = team.client.put(  # a default hearing nothing: every job would "opt out" of it (review108 #10)
        "/api/v1/users/alice/job-notify", json={"notify": {"on": []}}, headers=team.headers["alice"]
    )
    assert empty.status_code == 422 and "needs at least one event" in empty.text, empty.text
    defaulted = submit(team, None, name="plain")
    own = submit(team, {"on": ["succeeded"]}, name="own")
    assert team.get(f"/jobs/{defaulted}")["spec"]["notify"] == {"on": ["failed"], "to": []}
    assert team.get(f"/jobs/{own}")["spec"]["notify"] == {"on": ["succeeded"], "to": []}
    cleared = team.client.put(
        "/api/v1/users/alice/job-notify", json={"notify": None}, headers=team.headers["alice"]
    )
    assert cleared.status_code == 200 and cleared.json() == {"user": "alice", "notify": None}
    after = submit(team, None, name="after")
    assert "notify" not in team.get(f"/jobs/{after}")["spec"]
    now = time.time()
    with team.factory() as db:
        jobs = list(db.scalars(sa.select(Job).where(Job.id.in_([defaulted, own, after]))))
        assert lifecycle.transition_jobs(db, jobs, JobState.FAILED, now=now) == {defaulted, own, after}
        db.commit()
    assert outbox(team) == [(defaulted, "failed", "pending")]
    assert notification_pass(team, smtp, now) == 1
    assert smtp.inbox.messages[0]["Subject"] == f"[Corral] job {defaulted} plain failed"


def test_settled_deliveries_are_purged_after_their_keep_time_and_pending_ones_kept(
    team: Team, smtp: Smtp, hook: WebhookServer
) -> None:
    hook.status = 500
    assert team.post("/users/alice/contacts", {"kind": "webhook", "address": hook.url}).status_code == 201
    now = time.time()
    job_id = submit(team, {"on": ["failed"]})  # to every contact: her email (sent) and the webhook (failing)
    with team.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None and lifecycle.transition(db, job, JobState.FAILED, now=now, message="x")
        db.commit()
    assert notification_pass(team, smtp, now) == 2
    with team.factory() as db:
        assert job_notify.purge_settled(db, now) == 0  # nothing made before the cutoff
        assert job_notify.purge_settled(db, now + 1) == 1  # the sent mail; the failing webhook stays
    (note,) = team.get(f"/jobs/{job_id}/notifications")
    assert [(d["kind"], d["state"]) for d in note["deliveries"]] == [("webhook", "failing")]
    assert [e["message"] for e in team.get(f"/jobs/{job_id}/events") if e["kind"] == "notify"] == [
        "failed: notification sent by email"
    ]


def test_one_users_waiting_flood_never_holds_back_anothers_notification(
    team: Team, smtp: Smtp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alice is inside her minute with rows waiting; bob's one failure still goes out at once,
    and at the end of her minute all of hers go as one digest. A pass groups at most
    GROUP_USERS users: the others are grouped on the next pass."""
    monkeypatch.setattr(job_notify, "GROUP_USERS", 1)
    email = team.client.put(
        "/api/v1/users/bob/email", json={"email": "bob@example.org"}, headers=team.headers["bob"]
    )
    assert email.status_code == 200, email.text
    now = time.time()
    first = submit(team, {"on": ["failed"]}, name="first")
    flood = [submit(team, {"on": ["failed"]}, name=f"flood-{i}") for i in range(3)]
    bobs = submit(team, {"on": ["failed"]}, name="bobs", user="bob")
    with team.factory() as db:
        job = db.get(Job, first)
        assert job is not None and lifecycle.transition(db, job, JobState.FAILED, now=now, message="x")
        db.commit()
    assert notification_pass(team, smtp, now) == 1  # alice's first: her minute starts
    with team.factory() as db:
        jobs = list(db.scalars(sa.select(Job).where(Job.id.in_([*flood, bobs]))))
        assert lifecycle.transition_jobs(db, jobs, JobState.FAILED, now=now + 1) == {*flood, bobs}
        db.commit()
    assert notification_pass(team, smtp, now + 2) == 1
    assert smtp.inbox.to() == ["alice@example.org", "bob@example.org"]
    assert notification_pass(team, smtp, now + job_notify.DIGEST_WINDOW_S + 1) == 1  # all 3 of alice's
    assert smtp.inbox.messages[2]["Subject"] == "[Corral] 3 job notifications: 3 failed"
    assert notification_pass(team, smtp, now + 2 * job_notify.DIGEST_WINDOW_S + 2) == 0
    assert smtp.inbox.to() == ["alice@example.org", "bob@example.org", "alice@example.org"]
