"""A token made with an API token expires no later than that token (services.auth.capped_to_maker),
so a stolen short-lived token cannot mint a long-lived one; the answer's `note` says why it was
cut. A portal session (a password login) makes tokens of the normal lifetime."""

from __future__ import annotations

import pytest

from tests.api.conftest import ALICE_PASSWORD, World

API = "/api/v1"
DAY = 86400.0


def _mint(world: World, headers: dict[str, str], **body: object) -> dict[str, object]:
    r = world.client.post(f"{API}/tokens", json={"name": "made", **body}, headers=headers)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _bearer(secret: object) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_a_token_made_with_a_token_does_not_outlive_it(world: World) -> None:
    short = _mint(world, world.as_("alice"), expires_in_days=1)
    assert short["note"] is None
    for asked in ({}, {"expires_in_days": 365}):  # the default (90 days) and the maximum
        made = _mint(world, _bearer(short["token"]), **asked)
        assert made["expires_at"] == short["expires_at"], (made, short)
        assert made["note"] == (
            f"expires with token {short['id']}, the token it was made with: a token made with a token "
            "may not outlive it (the portal's Profile page makes a longer one)"
        )
    shorter = _mint(world, _bearer(short["token"]), expires_in_days=0.5)  # within it: as asked
    assert shorter["note"] is None
    assert shorter["expires_at"] - shorter["created_at"] == pytest.approx(0.5 * DAY)  # type: ignore[operator]


def test_an_admins_token_for_another_user_is_capped_alike(world: World) -> None:
    short = _mint(world, world.as_("admin"), expires_in_days=2)
    made = _mint(world, _bearer(short["token"]), user="bob", expires_in_days=30)
    assert (made["user"], made["expires_at"]) == ("bob", short["expires_at"]), made


def test_a_portal_session_and_a_token_that_never_expires_keep_the_normal_lifetime(world: World) -> None:
    made = _mint(world, world.as_("alice"))  # the fixture's token has no expiry
    assert made["expires_at"] - made["created_at"] == pytest.approx(90 * DAY)  # type: ignore[operator]
    c = world.client
    r = c.post(f"{API}/auth/login", json={"username": "alice", "password": ALICE_PASSWORD})
    assert r.status_code == 200, r.text
    made = _mint(world, {"X-CSRF-Token": r.json()["csrf_token"]}, expires_in_days=365)
    assert made["note"] is None and made["user"] == "alice"
    assert made["expires_at"] - made["created_at"] == pytest.approx(365 * DAY)  # type: ignore[operator]
    c.cookies.clear()
