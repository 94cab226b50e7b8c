"""Paging end to end against a real SMTP server (aiosmtpd) and a real webhook receiver: the
primary on call is emailed with a signed acknowledge link; nobody acks within the step's delay,
so the secondary is emailed; the link acknowledges and the escalation stops; a policy repeats K
times, then gives up; expired or altered links are refused. The loop's two steps
(`escalate_due`, `deliver_pages`) run with an explicit clock, so minutes of policy pass at once."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.audit_models import AuditRecord
from corral.db.oncall_models import ContactMethod, Page, PageNotification
from corral.monitor.pager import PagingSettings, deliver_pages
from corral.services import oncall, paging, webhook_guard
from corral.services.accounts import user_by_name
from corral.services.errors import Conflict
from tests.oncall.conftest import Env, Smtp
from tests.support import free_port
from tests.webhook_server import WebhookServer

LINK = re.compile(r"http://corral\.test/api/v1/ack/(\S+)")


def set_up(env: Env, repeat: int = 0) -> None:
    for name, who in (("primary", "alice"), ("secondary", "bob")):
        layer = {"rotation": "weekly", "start_date": "2026-01-05", "handoff": "09:00", "members": [who]}
        env.put(f"/oncall/schedules/{name}", {"time_zone": "Europe/Berlin", "layers": [layer]})
    steps = [{"schedule": "primary", "wait_minutes": 5}, {"schedule": "secondary", "wait_minutes": 5}]
    env.put("/oncall/policies/gpu", {"steps": steps, "repeat": repeat})


def start(env: Env, key: str, now: float) -> None:
    with env.factory() as db:
        paging.start(db, key=key, policy="gpu", subject="GPU 0 on node-a: ECC errors", body="ECC!", now=now)
        db.commit()


def tick(env: Env, smtp: Smtp, now: float) -> int:
    """One pass of the paging loop at `now`; returns how many notifications it handled. Its
    webhooks may reach what the server's CORRAL_WEBHOOK_ALLOW_NETWORKS allows, as in the server."""
    with env.factory() as db:
        paging.escalate_due(db, now)
    key = paging.link_key(env.settings)
    networks = webhook_guard.parse_networks(env.client.app.state.settings.webhook_allow_networks)
    return deliver_pages(env.factory, smtp.config(), PagingSettings(), key, now, networks)


def allow_loopback_webhooks(env: Env) -> None:
    """The admin allows webhooks to loopback (CORRAL_WEBHOOK_ALLOW_NETWORKS), so that people's
    contacts may point at the test's receiver on 127.0.0.1; without it they are refused."""
    settings = env.client.app.state.settings
    env.client.app.state.settings = settings.model_copy(update={"webhook_allow_networks": "127.0.0.0/8"})


def page(env: Env, key: str) -> Page:
    with env.factory() as db:
        found = paging.page_by_key(db, key)
        db.expunge(found)
        return found


@pytest.mark.parametrize("env", ["sqlite", "postgres"], indirect=True)
def test_primary_then_secondary_then_the_link_acks_and_escalation_stops(env: Env, smtp: Smtp) -> None:
    set_up(env)
    acked: list[tuple[str, str]] = []
    paging.register_ack_listener("incident:", lambda session, key, by: acked.append((key, by)))
    t0 = time.time()
    start(env, "incident:7", t0)
    start(env, "incident:7", t0 + 1)  # idempotent per key: still one page
    assert tick(env, smtp, t0) == 1
    assert smtp.inbox.wait_for(1, 5)
    first = smtp.inbox.messages[0]
    assert smtp.inbox.to() == ["alice@example.org"]
    assert first["Subject"] == "[Corral page] GPU 0 on node-a: ECC errors"
    body = first.get_payload(decode=True).decode()  # type: ignore[union-attr]
    link = LINK.search(body)
    assert link is not None, body
    assert tick(env, smtp, t0 + 299) == 0  # within the step's 5 minutes: nobody else is paged
    assert tick(env, smtp, t0 + 301) == 1
    assert smtp.inbox.wait_for(2, 5)
    assert smtp.inbox.to() == ["alice@example.org", "bob@example.org"]

    shown = env.client.get(f"/api/v1/ack/{link.group(1)}")  # opening the link does not ack
    assert shown.status_code == 200 and "Acknowledge</button>" in shown.text
    assert page(env, "incident:7").state == "triggered"
    answer = env.client.post(f"/api/v1/ack/{link.group(1)}")
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "acknowledged" and answer.json()["acked_by"] == "alice"
    assert acked == [("incident:7", "alice")]
    again = env.client.post(f"/api/v1/ack/{link.group(1)}")  # a second click changes nothing
    assert again.status_code == 200 and again.json()["acked_by"] == "alice"
    assert acked == [("incident:7", "alice")]

    assert tick(env, smtp, t0 + 3600) == 0  # escalation stopped: no more emails, ever
    time.sleep(0.2)
    assert len(smtp.inbox.messages) == 2
    with env.factory() as db:
        assert db.query(Page).count() == 1


@pytest.mark.parametrize("env", ["sqlite", "postgres"], indirect=True)
def test_policy_repeats_k_times_then_is_exhausted(env: Env, smtp: Smtp) -> None:
    set_up(env, repeat=1)
    t0 = time.time()
    start(env, "test:repeat", t0)
    for minute in (0, 5.1, 10.2, 15.3, 20.4, 40):
        tick(env, smtp, t0 + minute * 60)
    assert smtp.inbox.wait_for(4, 5)
    time.sleep(0.2)
    assert smtp.inbox.to() == ["alice@example.org", "bob@example.org"] * 2
    final = page(env, "test:repeat")
    assert final.state == "exhausted"
    assert "exhausted: nobody acknowledged after 2 rounds" in final.log[-1]
    ack = env.client.post(f"/api/v1/oncall/pages/{final.id}/ack", headers=env.people["bob"])
    assert ack.status_code == 200 and ack.json()["acked_by"] == "bob"  # still acknowledgeable
    carol = env.client.post(f"/api/v1/oncall/pages/{final.id}/ack", headers=env.people["carol"])
    assert carol.status_code == 404  # never paged for it: not hers to see or ack


def test_who_answered_before_is_paged_first_in_round_one_only_and_never_twice(env: Env) -> None:
    set_up(env, repeat=1)
    t0 = time.time()
    with env.factory() as db:
        alice, bob = (user_by_name(db, name).id for name in ("alice", "bob"))
        for key, first in (("test:bob-first", bob), ("test:alice-first", alice)):
            paging.start(db, key=key, policy="gpu", subject="s", body="b", now=t0, first_user_id=first)
        db.commit()
        for minute in (0, 5.1, 10.2, 15.3, 20.4, 40):
            paging.escalate_due(db, t0 + minute * 60)

        def paged(key: str) -> list[int]:
            page_id = paging.page_by_key(db, key).id
            rows = db.scalars(
                sa.select(PageNotification.user_id).where(PageNotification.page_id == page_id)
                .order_by(PageNotification.id)
            )  # fmt: skip
            return list(rows)

        # bob first, then the policy (alice's schedule, bob's); its repeat starts at its top
        assert paged("test:bob-first") == [bob, alice, bob, alice, bob]
        # alice is the policy's first on call now: not paged twice in a row
        assert len(paging.page_by_key(db, "test:alice-first").steps) == 2
        assert paged("test:alice-first") == [alice, bob, alice, bob]


def test_a_notification_queued_before_the_ack_is_skipped(env: Env, smtp: Smtp) -> None:
    set_up(env)
    t0 = time.time()
    start(env, "test:skip", t0)
    with env.factory() as db:
        paging.escalate_due(db, t0)  # queued, not yet sent ...
        paging.ack(db, "test:skip", "admin", t0 + 1)  # ... when someone acknowledges in Corral
        db.commit()
    key = paging.link_key(env.settings)
    assert deliver_pages(env.factory, smtp.config(), PagingSettings(), key, t0 + 2) == 1
    time.sleep(0.2)
    assert smtp.inbox.messages == []
    with env.factory() as db:
        assert [n.state for n in db.query(PageNotification)] == ["skipped"]


def test_a_page_waiting_for_an_address_its_person_changed_is_not_sent_there(env: Env, smtp: Smtp) -> None:
    """review #11: alice changes her email after a page was queued for the old one: nothing goes
    there, the notification says why; her new address gets the next round."""
    set_up(env, repeat=1)
    t0 = time.time()
    start(env, "test:moved", t0)
    with env.factory() as db:
        paging.escalate_due(db, t0)  # queued for alice@example.org
    changed = env.client.put(
        "/api/v1/users/alice/email", json={"email": "alice@new.example.org"}, headers=env.people["alice"]
    )
    assert changed.status_code == 200, changed.text
    assert tick(env, smtp, t0 + 1) == 1
    time.sleep(0.2)
    assert smtp.inbox.messages == []
    with env.factory() as db:
        (note,) = db.query(PageNotification)
        assert (note.state, note.last_error) == (
            "skipped",
            "the email address is no longer one of alice's contacts (removed or changed)",
        )
    assert tick(env, smtp, t0 + 301) == 1 and tick(env, smtp, t0 + 602) == 1  # bob, then alice again
    assert smtp.inbox.wait_for(2, 5) and smtp.inbox.to() == ["bob@example.org", "alice@new.example.org"]


def test_expired_altered_and_malformed_links_are_refused(env: Env, smtp: Smtp) -> None:
    set_up(env)
    now = time.time()
    start(env, "test:links", now)
    key = paging.link_key(env.settings)
    with env.factory() as db:
        page_id = paging.page_by_key(db, "test:links").id
    good = paging.ack_token(key, page_id, 2, now + 600)
    expired = paging.ack_token(key, page_id, 2, now - 1)
    answer = env.client.post(f"/api/v1/ack/{expired}")
    assert answer.status_code == 410 and "expired" in answer.json()["detail"]
    payload, signature = good.split(".")
    forged_payload = paging.ack_token(b"another key" * 3, page_id, 1, now + 600).split(".")[0]
    for bad in (f"{forged_payload}.{signature}", f"{payload}.{signature[:-2]}AA"):
        answer = env.client.post(f"/api/v1/ack/{bad}")
        assert answer.status_code == 403 and "signature does not match" in answer.json()["detail"]
    assert env.client.post(f"/api/v1/ack/{payload}.").status_code == 422  # no signature at all
    assert env.client.post("/api/v1/ack/abc.def-ghi").status_code == 403
    assert page(env, "test:links").state == "triggered"  # nothing half-done by a refused link
    assert env.client.post(f"/api/v1/ack/{good}").status_code == 200


def contact(env: Env, user: str, kind: str, address: str, as_user: str) -> Any:
    body = {"kind": kind, "address": address}
    return env.client.post(f"/api/v1/users/{user}/contacts", json=body, headers=env.people[as_user])


def test_webhook_and_slack_payloads_reach_a_real_server(env: Env, smtp: Smtp, hook: WebhookServer) -> None:
    set_up(env)
    allow_loopback_webhooks(env)
    for kind, path in (("slack", "/slack"), ("webhook", "/generic")):
        added = contact(env, "alice", kind, hook.url + path, as_user="alice")
        assert added.status_code == 201, added.text
    refused = contact(env, "alice", "slack", "alice@example.org", as_user="alice")
    assert refused.status_code == 422 and "needs an http(s):// URL" in refused.text
    refused = contact(env, "alice", "slack", "not-a-url", as_user="alice")
    assert (
        refused.status_code == 422
        and "'not-a-url' is neither an email address nor an http(s):// URL" in refused.text
    )
    other = contact(env, "alice", "email", "x@y.org", as_user="bob")
    assert other.status_code == 403
    seen = env.client.get("/api/v1/users/alice/contacts", headers=env.people["bob"])  # a read says "see"
    assert seen.status_code == 403 and "only alice and admins may see alice's contact methods" in seen.text
    t0 = time.time()
    start(env, "test:hooks", t0)
    assert tick(env, smtp, t0) == 3  # alice's email, her Slack and her generic webhook
    bodies: dict[str, Any] = dict(hook.posts)
    assert set(bodies) == {"/slack", "/generic"}
    slack, generic = bodies["/slack"], bodies["/generic"]
    assert slack["text"].startswith("*Page: GPU 0 on node-a: ECC errors*")
    assert LINK.search(slack["text"]) and slack["attachments"][0]["title_link"].startswith(
        "http://corral.test/"
    )
    assert generic["event"] == "page" and generic["recipient"] == "alice"
    assert generic["page"]["key"] == "test:hooks" and generic["page"]["step"] == 1
    token = generic["ack_url"].rsplit("/", 1)[1]
    assert env.client.post(f"/api/v1/ack/{token}").json()["acked_by"] == "alice"


def test_webhooks_to_the_clusters_own_networks_are_refused_when_added_and_when_sent(
    env: Env, smtp: Smtp, hook: WebhookServer
) -> None:
    """Any user may add a webhook contact, and a page makes the server POST to it from inside the
    cluster (review104 finding 13). Loopback, link-local and private hosts are refused when the
    contact is added (422 naming the setting that allows them) and again at send time, where a
    name is resolved anew (a contact stored before, or a name whose address changed)."""
    set_up(env)
    for address in (
        hook.url + "/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5:8080/hook",
        "https://192.168.1.2/hook",
        "http://[::1]:9820/api",
        "http://[::ffff:127.0.0.1]/x",
        "http://0.0.0.0:9820/x",
        "http://localhost:9820/x",  # a name: what it resolves to counts
    ):
        refused = contact(env, "alice", "webhook", address, as_user="alice")
        assert refused.status_code == 422, (address, refused.text)
        assert "which contacts may not reach" in refused.text
        assert "CORRAL_WEBHOOK_ALLOW_NETWORKS" in refused.text
        assert refused.json()["detail"][0]["loc"] == ["body", "address"]
    # A public address, and a name that does not resolve now, are accepted (checked when sent).
    for address in ("https://8.8.8.8/hook", "https://hooks.invalid/services/T0/B0/x"):
        assert contact(env, "alice", "slack", address, as_user="alice").status_code == 201, address
    # Stored before this check (or pointing at a name that now resolves to loopback): refused
    # at send time, and the receiver gets nothing.
    with env.factory() as db:
        alice = user_by_name(db, "alice")
        db.query(ContactMethod).filter(ContactMethod.user_id == alice.id).delete()
        port = hook.url.rsplit(":", 1)[1]
        stored = f"http://localhost:{port}/y"
        db.add(ContactMethod(user_id=alice.id, kind="webhook", address=stored, created_at=time.time()))
        db.commit()
    t0 = time.time()
    start(env, "test:ssrf", t0)
    assert tick(env, smtp, t0) == 2  # alice's email and her webhook, refused
    shown = env.client.get(f"/api/v1/oncall/pages/{page(env, 'test:ssrf').id}", headers=env.admin)
    (note,) = [n for n in shown.json()["notifications"] if n["kind"] == "webhook"]
    assert note["state"] == "failing" and "is a loopback address" in note["last_error"], note
    assert hook.posts == []
    # The admin allows loopback: the same contact is added and its page delivered.
    allow_loopback_webhooks(env)
    assert contact(env, "alice", "webhook", hook.url + "/z", as_user="alice").status_code == 201
    start(env, "test:allowed", t0)
    tick(env, smtp, t0)
    assert "/z" in dict(hook.posts) and "/y" in dict(hook.posts)


def test_a_failing_webhook_contact_does_not_show_its_url_path(env: Env, smtp: Smtp) -> None:
    """A Slack webhook's URL path is its credential; a failed page delivery's error is kept on the
    notification and shown in the page's views, to admins and to everyone the page notified, and
    it held the whole URL (only alice and admins may see alice's contact methods)."""
    set_up(env)
    allow_loopback_webhooks(env)
    port = free_port()  # nothing listens there
    added = contact(env, "alice", "slack", f"http://u:pw@127.0.0.1:{port}/services/T0/B0/s3cret?k=v", "alice")
    assert added.status_code == 201, added.text
    t0 = time.time()
    start(env, "test:failing-hook", t0)
    assert tick(env, smtp, t0) == 2  # alice's email and her Slack webhook, which fails
    shown = env.client.get(f"/api/v1/oncall/pages/{page(env, 'test:failing-hook').id}", headers=env.admin)
    (failed,) = [n for n in shown.json()["notifications"] if n["kind"] == "slack"]
    assert failed["state"] == "failing"
    assert failed["last_error"].startswith(f"POST http://127.0.0.1:{port}/...: "), failed["last_error"]
    assert "s3cret" not in failed["last_error"] and ":pw@" not in failed["last_error"]
    # The page views showed the contact's URL itself too (GET /oncall/pages: to everyone the page
    # notified), and an error kept before errors were shown so.
    url = f"http://u:pw@127.0.0.1:{port}/services/T0/B0/s3cret?k=v"
    with env.factory() as db:
        db.execute(
            sa.update(PageNotification)
            .where(PageNotification.kind == "slack")
            .values(last_error=f"POST {url}: old")
        )
        db.commit()
    for who in (env.admin, env.people["alice"]):
        (seen,) = [
            p
            for p in env.client.get("/api/v1/oncall/pages", headers=who).json()
            if p["key"] == "test:failing-hook"
        ]
        (failed,) = [n for n in seen["notifications"] if n["kind"] == "slack"]
        assert failed["address"] == f"http://127.0.0.1:{port}/..."
        assert failed["last_error"] == f"POST http://127.0.0.1:{port}/...: old"


def test_a_persons_contact_addresses_show_only_to_them_and_admins(env: Env, smtp: Smtp) -> None:
    """A page's views (GET /oncall/pages, /oncall/pages/{id}, the link's JSON answer) showed every
    paged person's address to everyone the page notified: bob read alice's email and she his.
    Others now see the kind and the delivery, the address and an error naming it hidden."""
    set_up(env)
    t0 = time.time()
    start(env, "test:addresses", t0)
    assert tick(env, smtp, t0) == 1 and tick(env, smtp, t0 + 301) == 1  # alice, then bob
    assert smtp.inbox.wait_for(2, 5)
    with env.factory() as db:  # an error kept on bob's notification that names his address
        db.execute(
            sa.update(PageNotification)
            .where(PageNotification.address == "bob@example.org")
            .values(last_error="550 <bob@example.org>: mailbox full")
        )
        db.commit()
    page_id = page(env, "test:addresses").id

    def notes(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {n["user"]: n for n in view["notifications"]}

    as_admin = notes(env.client.get(f"/api/v1/oncall/pages/{page_id}", headers=env.admin).json())
    assert as_admin["alice"]["address"] == "alice@example.org"
    assert as_admin["bob"]["address"] == "bob@example.org"
    assert as_admin["bob"]["last_error"] == "550 <bob@example.org>: mailbox full"
    for viewer, other in (("alice", "bob"), ("bob", "alice")):
        listed = env.client.get("/api/v1/oncall/pages", headers=env.people[viewer]).json()
        (mine,) = [notes(p) for p in listed if p["id"] == page_id]
        shown = notes(env.client.get(f"/api/v1/oncall/pages/{page_id}", headers=env.people[viewer]).json())
        for seen in (mine, shown):
            assert seen[viewer]["address"] == f"{viewer}@example.org"
            assert seen[other]["address"] is None, seen[other]
            assert seen[other]["kind"] == "email" and seen[other]["state"] == "sent"
            assert "example.org" not in str(seen[other])
    assert shown["bob"]["last_error"] == "550 <bob@example.org>: mailbox full"  # bob's own
    as_alice = notes(env.client.get(f"/api/v1/oncall/pages/{page_id}", headers=env.people["alice"]).json())
    assert as_alice["bob"]["last_error"] == "550 <(email address hidden)>: mailbox full"
    link = LINK.search(smtp.inbox.messages[0].get_payload(decode=True).decode())  # type: ignore[union-attr]
    assert link is not None
    acked = notes(env.client.post(f"/api/v1/ack/{link.group(1)}").json())  # alice's link
    assert acked["alice"]["address"] == "alice@example.org" and acked["bob"]["address"] is None


def test_a_gap_is_warned_and_its_step_falls_through_to_the_next(env: Env, smtp: Smtp) -> None:
    layer = {
        "rotation": "daily", "start_date": "2026-01-05", "members": ["alice"],
        "restrict_from": "09:00", "restrict_to": "17:00",
    }  # fmt: skip
    view = env.put("/oncall/schedules/office", {"time_zone": "Europe/Berlin", "layers": [layer]})
    assert view["warnings"] and "nobody is paged for this schedule" in view["warnings"][0]
    steps = [{"schedule": "office", "wait_minutes": 5}, {"user": "bob", "wait_minutes": 5}]
    env.put("/oncall/policies/gpu", {"steps": steps})
    night = 1795122000.0  # 2026-11-19 22:00 Europe/Berlin: in the gap
    start(env, "test:gap", night)
    assert tick(env, smtp, night) == 1
    assert smtp.inbox.wait_for(1, 5) and smtp.inbox.to() == ["bob@example.org"]
    log = page(env, "test:gap").log
    assert "office: nobody on call (gap, no fallback): 0 notifications" in log[0]
    # a user step names the user, as a schedule step does (it said "user #2")
    assert any("step 2: user bob: 1 notification" in line for line in log), log
    spec = {"time_zone": "Europe/Berlin", "layers": [layer], "fallback_user": "carol"}
    with_fallback = env.put("/oncall/schedules/office", spec)
    assert "the fallback user carol is paged" in with_fallback["warnings"][0]


def test_ended_pages_are_purged_with_their_notifications(env: Env, smtp: Smtp) -> None:
    set_up(env)
    t0 = time.time()
    for key in ("old:acked", "old:open", "new:acked"):
        start(env, key, t0 - 100 * 86400 if key.startswith("old") else t0)
    tick(env, smtp, t0)
    with env.factory() as db:
        paging.ack(db, "old:acked", "alice", t0 - 95 * 86400)
        paging.ack(db, "new:acked", "alice", t0)
        db.commit()
        assert paging.purge_ended(db, t0 - 90 * 86400) == 1
        assert sorted(p.key for p in db.query(Page)) == ["new:acked", "old:open"]  # triggered pages stay
        assert {n.page_id for n in db.query(PageNotification)} == {p.id for p in db.query(Page)}


def test_calendar_feed_works_without_login_and_refuses_an_altered_url(env: Env) -> None:
    layer = {"rotation": "daily", "start_date": "2026-01-05", "handoff": "09:00", "members": ["alice", "bob"]}
    env.put("/oncall/schedules/primary", {"time_zone": "Europe/Berlin", "layers": [layer]})
    view = env.client.get("/api/v1/oncall/schedules/primary", headers=env.people["bob"]).json()
    feed = env.client.get(view["ical_feed"])  # no Authorization header
    assert feed.status_code == 200 and feed.headers["content-type"].startswith("text/calendar")
    text = feed.text
    assert text.startswith("BEGIN:VCALENDAR\r\n") and text.endswith("END:VCALENDAR\r\n")
    assert "SUMMARY:alice on call (primary)" in text and "SUMMARY:bob on call (primary)" in text
    assert "DTSTART:" in text and text.count("BEGIN:VEVENT") >= 28  # four weeks of daily shifts
    altered = view["ical_feed"].replace("/primary.", "/other.")
    assert env.client.get(altered).status_code == 403


def test_only_admins_and_members_get_the_calendar_url_and_rotation_or_recreation_revokes_it(
    env: Env,
) -> None:
    """The URL works without a login, so it went to every member of the platform and worked
    forever, also for a new schedule of the same name (review104 finding 12). Now: admins and
    the schedule's own people only, and a per-schedule nonce in its HMAC that a rotation or a
    delete and re-create replaces."""
    layer = {"rotation": "daily", "start_date": "2026-01-05", "handoff": "09:00", "members": ["alice"]}
    env.put("/oncall/schedules/primary", {"time_zone": "UTC", "fallback_user": "bob", "layers": [layer]})
    path = "/api/v1/oncall/schedules/primary"
    seen = {who: env.client.get(path, headers=env.people[who]).json()["ical_feed"] for who in env.people}
    admin_url = env.client.get(path, headers=env.admin).json()["ical_feed"]
    assert seen["carol"] is None  # neither a layer member nor the fallback user
    assert seen["alice"] == seen["bob"] == admin_url and admin_url.startswith("/api/v1/oncall/feeds/primary.")
    assert env.client.get(admin_url).status_code == 200

    r = env.client.post(f"{path}/feed/rotate", headers=env.people["alice"])
    assert r.status_code == 403 and "only admins" in r.json()["detail"]
    assert env.client.get(admin_url).status_code == 200  # a refused rotation changed nothing
    r = env.client.post(f"{path}/feed/rotate", headers=env.admin)
    assert r.status_code == 200, r.text
    rotated = r.json()["ical_feed"]
    assert (
        rotated != admin_url
        and env.client.get(path, headers=env.people["alice"]).json()["ical_feed"] == rotated
    )
    old = env.client.get(admin_url)
    assert old.status_code == 403 and "revoked" in old.json()["detail"]
    assert env.client.get(rotated).status_code == 200

    assert env.client.delete(path, headers=env.admin).status_code == 204
    assert env.client.get(rotated).status_code == 403  # deleted: refused like an altered URL
    env.put("/oncall/schedules/primary", {"time_zone": "UTC", "layers": [layer]})
    recreated = env.client.get(path, headers=env.admin).json()["ical_feed"]
    assert recreated not in (admin_url, rotated) and env.client.get(rotated).status_code == 403
    assert env.client.get(recreated).status_code == 200
    with env.factory() as db:
        actions = [r.action for r in db.scalars(sa.select(AuditRecord).order_by(AuditRecord.id))]
    assert actions.count("oncall.schedule.feed_rotate") == 1


def test_the_calendar_feeds_first_and_last_events_are_whole_shifts(env: Env) -> None:
    """The feed's first event began exactly a day before the request ("from a day ago": the shift
    cut there) and its last ended four weeks after it, so both had a start or end no handoff has
    and a UID made of it that changed on every fetch: a subscribed calendar replaced them each
    time, or kept each fetch's as another event. They are the whole shifts now."""
    layer = {"rotation": "daily", "start_date": "2026-01-05", "handoff": "09:00", "members": ["alice", "bob"]}
    env.put("/oncall/schedules/primary", {"time_zone": "UTC", "layers": [layer]})
    now = 1_795_000_000.0  # 2026-11-18 11:06:40Z
    with env.factory() as db:
        feeds = [oncall.ical_feed(db, "primary", t) for t in (now, now + 60.0, now + 3600.0)]
    events = [re.findall(r"UID:(.*?)\r\nDTSTAMP:.*?\r\nDTSTART:(.*?)\r\nDTEND:(.*?)\r\n", f) for f in feeds]
    assert events[0][0] == ("primary-1794906000-1794992400@corral", "20261117T090000Z", "20261118T090000Z")
    assert events[0][-1][2] == "20261217T090000Z"  # the shift under way four weeks ahead, whole
    assert events[0] == events[1] == events[2]
    assert all(start.endswith("T090000Z") and end.endswith("T090000Z") for _, start, end in events[0])


@pytest.mark.parametrize("env", ["sqlite", "postgres"], indirect=True)
def test_an_ack_and_a_cancel_at_once_the_first_stands(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another request changes the page between this one's read and its write (e.g. the incident
    resolves while someone clicks the link): the first change stands, the second changes nothing."""
    set_up(env)
    now = time.time()
    start(env, "race:1", now)
    start(env, "race:2", now)
    real = paging.page_by_key

    def meanwhile(other: Callable[[Session, str], object]) -> Callable[[Session, str], Page]:
        def read(session: Session, key: str) -> Page:
            found = real(session, key)
            monkeypatch.setattr(paging, "page_by_key", real)
            with env.factory() as db:
                other(db, key)
                db.commit()
            return found

        return read

    monkeypatch.setattr(
        paging, "page_by_key", meanwhile(lambda db, key: paging.ack(db, key, "alice", now + 1))
    )
    with env.factory() as db:
        assert paging.cancel(db, "race:1", now + 2).state == "acknowledged"
        db.commit()
    assert (page(env, "race:1").state, page(env, "race:1").acked_by) == ("acknowledged", "alice")
    monkeypatch.setattr(paging, "page_by_key", meanwhile(lambda db, key: paging.cancel(db, key, now + 1)))
    with env.factory() as db, pytest.raises(Conflict, match="was cancelled"):
        paging.ack(db, "race:2", "alice", now + 2)
    assert page(env, "race:2").state == "cancelled"


def test_a_bad_webhook_allow_list_refuses_start_naming_the_entry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"CORRAL_WEBHOOK_ALLOW_NETWORKS: 'nope' is not a network"):
        Settings(home=tmp_path, webhook_allow_networks="10.0.0.0/8, nope")
    settings = Settings(home=tmp_path, webhook_allow_networks=" 10.20.0.0/16 ,192.168.1.5,fd00::/8 ")
    assert [str(n) for n in webhook_guard.parse_networks(settings.webhook_allow_networks)] == [
        "10.20.0.0/16",
        "192.168.1.5/32",
        "fd00::/8",
    ]
