"""Holds over the API (`POST /jobs/{id}/hold`, `/release`, `POST /jobs?hold=true`): who may hold
and release, what a held job's view and diagnosis say, repeats, refusals naming the state, the
events and audit entries they leave (services/holds.py)."""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa

from corral.db.audit_models import AuditRecord
from corral.db.models import Job
from corral.services import accounts, auth
from tests.api.conftest import SIMPLE_JOB, World
from tests.api.helpers import add_node, make_running

JOBS = "/api/v1/jobs"
# "held by alice since 2026-11-30 00:20:05 UTC: corral release 7"
HELD_TEXT = r"held by {user} since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC: corral release {job}"


def queued(world: World, user: str = "alice", **params: str) -> int:
    r = world.client.post(JOBS, json=SIMPLE_JOB, headers=world.as_(user), params=params)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def hold(world: World, job_id: int, user: str) -> Any:
    return world.client.post(f"{JOBS}/{job_id}/hold", headers=world.as_(user))


def release(world: World, job_id: int, user: str) -> Any:
    return world.client.post(f"{JOBS}/{job_id}/release", headers=world.as_(user))


def event_kinds(world: World, job_id: int) -> list[str]:
    r = world.client.get(f"{JOBS}/{job_id}/events", headers=world.as_("admin"))
    assert r.status_code == 200, r.text
    return [e["kind"] for e in r.json()]


def audit_actions(world: World) -> list[tuple[str, str, str]]:
    with world.session_factory() as db:
        rows = db.scalars(sa.select(AuditRecord).order_by(AuditRecord.id))
        return [(r.actor, r.action, r.target_id) for r in rows if r.action.startswith("job.")]


def test_the_owner_holds_and_releases_with_events_and_no_audit_entry(world: World) -> None:
    job = queued(world)
    r = hold(world, job, "alice")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["changed"] is True and re.fullmatch(
        f"job {job} " + HELD_TEXT.format(user="alice", job=job), body["message"]
    )
    assert body["job"]["state"] == "queued" and body["job"]["hold"]["by"] == "alice"
    assert body["job"]["hold"]["admin"] is False
    shown = world.client.get(f"{JOBS}/{job}", headers=world.as_("alice")).json()
    diagnosis = shown["diagnosis"]
    (reason,) = diagnosis["reasons"]
    assert reason["code"] == "on_hold" and re.fullmatch(
        HELD_TEXT.format(user="alice", job=job), reason["message"]
    )
    assert diagnosis["queue_position"] is None and diagnosis["estimated_start"] is None
    assert diagnosis["held"] is True  # "held" as Slurm's users read it: the reason says by whom
    assert body["job"]["diagnosis"]["held"] is True
    assert shown["created_at"] == body["job"]["created_at"]  # its submit time is kept
    logs = world.client.get(f"{JOBS}/{job}/logs", headers=world.as_("alice")).json()
    assert re.fullmatch(
        f"job {job} is queued: " + HELD_TEXT.format(user="alice", job=job), logs["waiting"]["message"]
    )
    assert logs["waiting"]["queue_position"] is None and logs["waiting"]["estimated_start"] is None
    assert logs["waiting"]["held"] is True
    listed = world.client.get(JOBS, headers=world.as_("alice")).json()["items"]
    assert [j["hold"]["by"] for j in listed] == ["alice"]
    assert [j["diagnosis"]["held"] for j in listed] == [True]

    again = hold(world, job, "alice")  # a repeat: 200, says so, writes nothing
    assert again.status_code == 200 and again.json()["changed"] is False
    assert again.json()["message"].startswith(f"job {job} was already held by alice since ")
    assert event_kinds(world, job) == ["transition", "hold"]

    r = release(world, job, "alice")
    assert r.status_code == 200 and r.json()["changed"] is True, r.text
    assert r.json()["message"] == f"job {job} released: it is queued again"
    assert r.json()["job"]["hold"] is None and r.json()["job"]["diagnosis"] is None
    waiting = world.client.get(f"{JOBS}/{job}/logs", headers=world.as_("alice")).json()["waiting"]
    assert waiting["held"] is False and waiting["reasons"] == []  # released: not held any more
    r = release(world, job, "alice")  # not held: 200, nothing changed
    assert r.status_code == 200 and r.json() == {
        **r.json(),
        "changed": False,
        "message": f"job {job} is not held",
    }
    assert event_kinds(world, job) == ["transition", "hold", "release"]
    assert audit_actions(world) == []  # the owner's own holds are no audit entries


def test_who_may_hold_and_release(world: World) -> None:
    job = queued(world)
    # carol (another group's member) may not see alice's job: the answer every job route gives
    for call in (hold, release):
        r = call(world, job, "carol")
        assert (r.status_code, r.json()["detail"]) == (404, f"no job with id {job}"), r.text
    assert hold(world, 999999, "alice").status_code == 404
    # bob, vision's group admin, holds and releases alice's job: audited (alice's own release not)
    r = hold(world, job, "bob")
    assert r.status_code == 200 and r.json()["job"]["hold"]["by"] == "bob", r.text
    assert r.json()["job"]["hold"]["admin"] is False
    assert release(world, job, "alice").json()["changed"] is True  # a group admin's hold: the owner may
    assert hold(world, job, "bob").json()["changed"] is True
    assert release(world, job, "bob").json()["changed"] is True
    assert audit_actions(world) == [
        ("bob", "job.hold", str(job)),
        ("bob", "job.hold", str(job)),
        ("bob", "job.release", str(job)),
    ]


def test_an_admin_hold_is_released_only_by_an_admin(world: World) -> None:
    job = queued(world)
    r = hold(world, job, "admin")
    assert r.status_code == 200 and r.json()["job"]["hold"]["admin"] is True, r.text
    for user in ("alice", "bob"):
        r = release(world, job, user)
        assert r.status_code == 403, r.text
        assert r.json()["detail"] == f"job {job} is held by admin as an admin: only an admin can release it"
    shown = world.client.get(f"{JOBS}/{job}", headers=world.as_("alice")).json()
    assert shown["hold"]["by"] == "admin" and shown["state"] == "queued"
    r = release(world, job, "admin")
    assert r.status_code == 200 and r.json()["changed"] is True
    with world.session_factory() as db:
        row = db.get(Job, job)
        assert row is not None and (row.held_by, row.held_at, row.held_as_admin) == (None, None, False)
    assert [a for _, a, _ in audit_actions(world)] == ["job.hold", "job.release"]


def test_only_a_queued_job_can_be_held(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    running = queued(world)
    with world.session_factory() as db:
        make_running(db, running)
    r = hold(world, running, "alice")
    assert r.status_code == 409, r.text
    assert r.json()["detail"] == f"job {running} is running: only a queued job can be held; cancel it instead"
    ended = queued(world)
    assert world.client.post(f"{JOBS}/{ended}/cancel", headers=world.as_("alice")).status_code == 200
    r = hold(world, ended, "alice")
    assert r.status_code == 409
    assert r.json()["detail"] == f"job {ended} has already ended (cancelled): only a queued job can be held"
    assert event_kinds(world, running) == ["transition"]
    # a held job that is cancelled is no longer held: its hold does not show, release changes nothing
    held = queued(world)
    assert hold(world, held, "alice").status_code == 200
    assert world.client.post(f"{JOBS}/{held}/cancel", headers=world.as_("alice")).json()["hold"] is None
    assert release(world, held, "alice").json()["changed"] is False


def test_submit_held(world: World) -> None:
    job = queued(world, hold="true")
    shown = world.client.get(f"{JOBS}/{job}", headers=world.as_("alice")).json()
    assert shown["state"] == "queued" and shown["hold"]["by"] == "alice" and shown["hold"]["admin"] is False
    assert [e["kind"] for e in shown["events"]] == ["transition", "hold"]
    assert shown["diagnosis"]["reasons"][0]["code"] == "on_hold"
    r = world.client.post(JOBS, json=SIMPLE_JOB, headers=world.as_("alice"))  # no ?hold: not held
    assert r.json()["hold"] is None
    r = world.client.post(JOBS, json=SIMPLE_JOB, headers=world.as_("alice"), params={"hold": "maybe"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "hold"], r.text


def test_the_openapi_says_what_held_means(world: World) -> None:
    """`held` in a diagnosis and a log's waiting status: on hold or held back by a quota or cap,
    told apart by the reasons: what an API user reads, in both places."""
    schemas = world.client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("DiagnosisOut", "corral__api__schemas__WaitingOut"):  # (the workspaces have one too)
        described = schemas[name]["properties"]["held"]["description"]
        assert "on hold" in described and "`on_hold`" in described, (name, described)
        assert "quota" in described and "`user_cap`" in described, (name, described)


def test_a_job_list_loads_its_holders_in_one_query(world: World) -> None:
    """alice's jobs held by five people (herself, bob her group admin, three admins) and one not
    held: the list names each holder, read in one query for the whole page (not one per job)."""
    with world.session_factory() as db:
        for name in ("dora", "erin", "fay"):
            user = accounts.create_user(db, accounts.NewUser(name, is_admin=True))
            _row, secret = auth.create_token(db, user, "test")
            world.headers[name] = {"Authorization": f"Bearer {secret}"}
        db.commit()
    holders = ["alice", "bob", "dora", "erin", "fay"]
    jobs = {queued(world): holder for holder in holders}
    for job, holder in jobs.items():
        assert hold(world, job, holder).status_code == 200
    free = queued(world)
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    def user_reads(**params: str) -> tuple[list[dict[str, Any]], list[str]]:
        """One page as the admin, and the statements that read users to show it."""
        seen.clear()
        bind = world.session_factory.kw["bind"]
        sa.event.listen(bind, "before_cursor_execute", record)
        try:
            r = world.client.get(JOBS, headers=world.as_("admin"), params=params)
        finally:
            sa.event.remove(bind, "before_cursor_execute", record)
        assert r.status_code == 200, r.text
        return r.json()["items"], [s for s in seen if re.search(r'\bFROM\s+"?users"?(\s|$)', s, re.I)]

    items, reads = user_reads()
    listed = {j["id"]: j["hold"] for j in items}
    assert {job: listed[job]["by"] for job in jobs} == jobs and listed[free] is None
    assert all(listed[job]["admin"] is (holder in ("dora", "erin", "fay")) for job, holder in jobs.items())
    assert len(reads) == 1, reads  # the holders, all at once (owners come joined with the jobs)
    items, reads = user_reads(limit="1")  # the newest only: not held, no holder to read
    assert [j["id"] for j in items] == [free] and reads == []
