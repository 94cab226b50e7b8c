"""The contact routes check "the user themselves or an admin" before looking the user up, so
anyone else gets the same 403 for a user who exists and for a name no user has: they tell no one
which user names exist (as the user routes' password and default-group changes do). Admins
still get 404 for an unknown name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.oncall.conftest import Env

Call = Callable[[Env, str, dict[str, str]], Any]
CALLS: dict[str, tuple[str, Call]] = {
    "GET /users/{name}/contacts": (
        "see",
        lambda e, name, who: e.client.get(f"/api/v1/users/{name}/contacts", headers=who),
    ),
    "PUT /users/{name}/email": (
        "change",
        lambda e, name, who: e.client.put(
            f"/api/v1/users/{name}/email", json={"email": "x@y.org"}, headers=who
        ),
    ),
    "POST /users/{name}/contacts": (
        "change",
        lambda e, name, who: e.client.post(
            f"/api/v1/users/{name}/contacts", json={"kind": "email", "address": "x@y.org"}, headers=who
        ),
    ),
    "DELETE /users/{name}/contacts/{id}": (
        "change",
        lambda e, name, who: e.client.delete(f"/api/v1/users/{name}/contacts/1", headers=who),
    ),
}


@pytest.mark.parametrize("route", list(CALLS))
def test_another_user_gets_the_same_403_for_a_user_and_a_missing_name(env: Env, route: str) -> None:
    verb, call = CALLS[route]
    answers = []
    for name in ("alice", "nosuch"):
        r = call(env, name, env.people["bob"])
        answers.append((r.status_code, r.json()["detail"].replace(name, "NAME")))
    refused = (403, f"only NAME and admins may {verb} NAME's contact methods")
    assert answers[0] == answers[1] == refused, answers
    r = call(env, "nosuch", env.admin)  # an admin may manage anyone's: told the name is unknown
    assert (r.status_code, r.json()["detail"]) == (404, "no user named 'nosuch'"), r.text


def test_the_user_and_admins_still_manage_the_contacts(env: Env) -> None:
    for who in (env.people["alice"], env.admin):
        r = env.client.get("/api/v1/users/alice/contacts", headers=who)
        assert r.status_code == 200 and r.json()["user"] == "alice", r.text
    r = env.client.put("/api/v1/users/alice/email", json={"email": "a@b.org"}, headers=env.people["alice"])
    assert r.status_code == 200 and r.json()["email"] == "a@b.org", r.text
