"""Taking access away: removing a group member, deactivating and reactivating a user
(corral.services.offboard), and what a non-member learns about group names."""

from __future__ import annotations

from typing import Any

from corral.db.models import Job
from corral.services.lifecycle import JobState
from tests.api.conftest import ALICE_PASSWORD, SIMPLE_JOB, World

API = "/api/v1"


def _submit(w: World, user: str = "alice", **extra: Any) -> int:
    r = w.client.post(f"{API}/jobs", json={**SIMPLE_JOB, **extra}, headers=w.as_(user))
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _state(w: World, job_id: int) -> str:
    with w.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        return job.state


def _actions(w: World) -> list[str]:
    r = w.client.get(f"{API}/audit", headers=w.as_("admin"))
    assert r.status_code == 200, r.text
    return [item["action"] for item in r.json()["items"]]


def test_a_member_with_live_jobs_is_removed_only_with_them_cancelled(world: World) -> None:
    w = world
    job = _submit(w)
    elsewhere = None
    r = w.client.post(f"{API}/groups/nlp/members", json={"user": "alice"}, headers=w.as_("admin"))
    assert r.status_code == 201, r.text
    elsewhere = _submit(w, group="nlp")
    r = w.client.delete(f"{API}/groups/vision/members/alice", headers=w.as_("bob"))  # the group's admin
    assert r.status_code == 409, r.text
    assert f"job {job}" in r.json()["detail"] and "--cancel-jobs" in r.json()["detail"], r.text
    assert f"job {elsewhere}" not in r.json()["detail"]  # only the group's jobs count
    assert _state(w, job) == JobState.QUEUED
    assert "group.member.remove" not in _actions(w)

    r = w.client.delete(f"{API}/groups/vision/members/alice?cancel_jobs=true", headers=w.as_("bob"))
    assert r.status_code == 204, r.text
    assert _state(w, job) == JobState.CANCELLED  # through the cancel path: audited as job.cancel
    assert _state(w, elsewhere) == JobState.QUEUED
    assert _actions(w)[:2] == ["group.member.remove", "job.cancel"]
    me = w.client.get(f"{API}/me", headers=w.as_("alice")).json()
    assert [g["name"] for g in me["groups"]] == ["nlp"] and me["default_group"] == "nlp", me
    # No longer a member: nothing more is submitted to the group.
    r = w.client.post(f"{API}/jobs", json={**SIMPLE_JOB, "group": "vision"}, headers=w.as_("alice"))
    assert r.status_code in (403, 404), r.text


def test_removing_a_non_member_or_the_last_admin_is_refused(world: World) -> None:
    w = world
    r = w.client.delete(f"{API}/groups/vision/members/carol", headers=w.as_("admin"))
    assert r.status_code == 404 and r.json()["detail"] == "user 'carol' is not a member of group 'vision'"
    r = w.client.delete(f"{API}/groups/vision/members/bob", headers=w.as_("admin"))
    assert r.status_code == 409 and "last admin" in r.json()["detail"], r.text
    r = w.client.delete(f"{API}/groups/vision/members/bob", headers=w.as_("alice"))  # a plain member
    assert r.status_code == 403, r.text
    r = w.client.delete(f"{API}/groups/vision/members/nobody", headers=w.as_("admin"))
    assert r.status_code == 404 and "nobody" in r.json()["detail"]


def test_a_non_member_cannot_tell_which_group_names_exist(world: World) -> None:
    """carol (nlp only) gets the same answer for vision (exists) as for a name no group has."""
    w = world
    for path, kwargs in (
        ("POST /groups/{}/members", {"json": {"user": "carol"}}),
        ("DELETE /groups/{}/members/alice", {}),
        ("GET /groups/{}", {}),
    ):
        method, template = path.split(" ")
        answers = []
        for name in ("vision", "no-such-group"):
            r = w.client.request(method, API + template.format(name), headers=w.as_("carol"), **kwargs)
            answers.append((r.status_code, r.json()["detail"].replace(name, "NAME")))
        assert answers[0] == answers[1] and answers[0][0] == 404, (path, answers)
    answers = []
    for name in ("vision", "no-such-group"):
        r = w.client.put(f"{API}/users/carol/default-group", json={"group": name}, headers=w.as_("carol"))
        answers.append((r.status_code, r.json()["detail"].replace(name, "NAME")))
    assert answers[0] == answers[1] and answers[0][0] == 404, answers


def test_a_deactivated_user_is_locked_out_at_once_and_back_when_reactivated(world: World) -> None:
    w = world
    assert w.client.get(f"{API}/me", headers=w.as_("alice")).status_code == 200  # cached now
    login = w.client.post(f"{API}/auth/login", json={"username": "alice", "password": ALICE_PASSWORD})
    assert login.status_code == 200, login.text
    cookie = dict(w.client.cookies)
    w.client.cookies.clear()
    job = _submit(w)
    r = w.client.post(f"{API}/users/alice/deactivate", headers=w.as_("admin"))
    assert r.status_code == 409 and f"job {job}" in r.json()["detail"], r.text
    assert w.client.get(f"{API}/me", headers=w.as_("alice")).status_code == 200

    r = w.client.post(f"{API}/users/alice/deactivate?cancel_jobs=true", headers=w.as_("admin"))
    assert r.status_code == 200 and r.json()["active"] is False, r.text
    assert _state(w, job) == JobState.CANCELLED
    # The token (cached a moment ago), the portal session and a new login all fail at once.
    r = w.client.get(f"{API}/me", headers=w.as_("alice"))
    assert r.status_code == 401 and "deactivated" in r.json()["detail"], r.text
    assert w.client.get(f"{API}/me", cookies=cookie).status_code == 401
    r = w.client.post(f"{API}/auth/login", json={"username": "alice", "password": ALICE_PASSWORD})
    assert r.status_code == 401, r.text
    w.client.cookies.clear()
    assert _actions(w)[:2] == ["user.deactivate", "job.cancel"]

    r = w.client.post(f"{API}/users/alice/activate", headers=w.as_("admin"))
    assert r.status_code == 200 and r.json()["active"] is True, r.text
    assert w.client.get(f"{API}/me", headers=w.as_("alice")).status_code == 200
    assert w.client.get(f"{API}/me", cookies=cookie).status_code == 401  # sessions stay ended
    assert _actions(w)[0] == "user.activate"


def test_an_admin_cannot_deactivate_themself(world: World) -> None:
    w = world
    r = w.client.post(f"{API}/users/admin/deactivate", headers=w.as_("admin"))
    assert r.status_code == 409 and "themself" in r.json()["detail"], r.text
    r = w.client.post(f"{API}/users/alice/deactivate", headers=w.as_("bob"))  # a group admin only
    assert r.status_code == 403, r.text
    r = w.client.post(f"{API}/users/nobody/deactivate", headers=w.as_("admin"))
    assert r.status_code == 404, r.text
