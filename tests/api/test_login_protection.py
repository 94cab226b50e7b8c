"""Login protection: failures counted per account and per address in the database, exponential
lockouts visible to admins; portal sessions and API tokens listed, revoked and expiring."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.config import Settings
from corral.db.models import LoginFailure
from corral.services.login_guard import Policy
from tests.api.conftest import ALICE_PASSWORD, World

API = "/api/v1"
WRONG = {"username": "alice", "password": "not-her-password"}
RIGHT = {"username": "alice", "password": ALICE_PASSWORD}


def server(db_engine: sa.Engine, tmp_path: Path, name: str, **overrides: Any) -> TestClient:
    settings = Settings(home=tmp_path / name, database_url="sqlite:///unused", **overrides)
    return TestClient(create_app(settings, db_engine=db_engine))


def test_lockout_doubles_from_the_threshold_up_to_the_cap() -> None:
    policy = Policy(after=3, base_s=10, max_s=50, window_s=3600)
    assert [policy.lock_for(n) for n in range(1, 7)] == [0, 0, 10, 20, 40, 50]


def test_repeated_failures_lock_the_account_across_servers(
    world: World, db_engine: sa.Engine, tmp_path: Path
) -> None:
    """Three failures lock alice's account; the lock holds for the right password too and on a
    second server on the same database (as after a restart); an admin sees and lifts it."""
    one = server(db_engine, tmp_path, "one", login_lockout_after=3, login_lockout_base_s=60)
    two = server(db_engine, tmp_path, "two", login_lockout_after=3, login_lockout_base_s=60)
    with one, two:
        for c in (one, two, one):  # counted together
            r = c.post(f"{API}/auth/login", json=WRONG)
            assert r.status_code == 401 and r.json()["detail"] == "wrong user name or password"
        for c in (one, two):
            r = c.post(f"{API}/auth/login", json=RIGHT)
            assert r.status_code == 429, r.text
            assert "account 'alice'" in r.json()["detail"] and 1 <= int(r.headers["retry-after"]) <= 60
        assert one.get(f"{API}/auth/lockouts", headers=world.as_("alice")).status_code == 403
        rows = one.get(f"{API}/auth/lockouts", headers=world.as_("admin")).json()
        account = next(r for r in rows if r["scope"] == "account")
        assert account["key"] == "alice" and account["failures"] == 3 and account["locked"]
        assert any(r["scope"] == "address" and r["failures"] == 3 for r in rows)
        assert not_in(rows, "not-her-password")
        # The address is locked too (same client): the admin lifts both.
        for row in rows:
            assert (
                one.delete(f"{API}/auth/lockouts/{row['id']}", headers=world.as_("admin")).status_code == 204
            )
        assert two.post(f"{API}/auth/login", json=RIGHT).status_code == 200
        assert two.get(f"{API}/auth/lockouts", headers=world.as_("admin")).json() == []  # success clears


def test_failures_after_a_lockout_double_it(world: World, db_engine: sa.Engine, tmp_path: Path) -> None:
    with server(db_engine, tmp_path, "s", login_lockout_after=2, login_lockout_base_s=30) as c:
        for _ in range(2):
            c.post(f"{API}/auth/login", json={"username": "ghost", "password": "x"})
        first = locked_until(world, "ghost")
        assert first is not None and 25 < first - time.time() <= 30
        with world.session_factory() as db:  # the lock runs out
            db.execute(sa.update(LoginFailure).values(locked_until=time.time() - 1))
            db.commit()
        assert c.post(f"{API}/auth/login", json={"username": "ghost", "password": "x"}).status_code == 401
        second = locked_until(world, "ghost")
        assert second is not None and 55 < second - time.time() <= 60


def test_a_failure_is_logged_without_the_password(
    world: World, db_engine: sa.Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with server(db_engine, tmp_path, "s") as c, caplog.at_level("WARNING"):
        c.post(f"{API}/auth/login", json=WRONG)
    assert "failed login for account 'alice'" in caplog.text
    assert "not-her-password" not in caplog.text


def test_sessions_are_listed_and_revoked_by_owner_and_admin(world: World) -> None:
    c = world.client
    assert c.post(f"{API}/auth/login", json=RIGHT).status_code == 200
    mine = c.get(f"{API}/sessions").json()
    assert len(mine) == 1 and mine[0]["user"] == "alice" and mine[0]["current"]
    assert mine[0]["expires_at"] - mine[0]["created_at"] == pytest.approx(12 * 3600)
    second = TestClient(c.app)
    assert second.post(f"{API}/auth/login", json=RIGHT).status_code == 200
    assert len(c.get(f"{API}/sessions").json()) == 2
    # Others cannot see or end them; an admin can.
    assert c.get(f"{API}/sessions?user=alice", headers=world.as_("carol")).status_code == 403
    assert c.delete(f"{API}/sessions/{mine[0]['id']}", headers=world.as_("carol")).status_code == 404
    everyone = c.get(f"{API}/sessions?all=true", headers=world.as_("admin")).json()
    assert {s["user"] for s in everyone} == {"alice"} and len(everyone) == 2
    assert c.delete(f"{API}/sessions/{mine[0]['id']}", headers=world.as_("admin")).status_code == 204
    assert c.get(f"{API}/me").status_code == 401  # that cookie is dead
    other = second.get(f"{API}/sessions").json()
    assert len(other) == 1
    r = second.delete(f"{API}/sessions/{other[0]['id']}", headers={"X-CSRF-Token": "forged"})
    assert r.status_code == 403  # a cookie-authenticated delete needs its CSRF token
    assert c.delete(f"{API}/sessions/nothex", headers=world.as_("admin")).status_code == 404


def test_session_lifetime_is_configurable(world: World, db_engine: sa.Engine, tmp_path: Path) -> None:
    with server(db_engine, tmp_path, "s", session_lifetime_s=600) as c:
        r = c.post(f"{API}/auth/login", json=RIGHT)
        assert "Max-Age=600" in r.headers["set-cookie"]
        (session,) = c.get(f"{API}/sessions").json()
        assert session["expires_at"] - session["created_at"] == pytest.approx(600)


def test_admins_list_and_revoke_others_tokens(world: World) -> None:
    c = world.client
    carol = c.get(f"{API}/tokens", headers=world.as_("carol")).json()
    assert [t["user"] for t in carol] == ["carol"]
    assert c.get(f"{API}/tokens?user=alice", headers=world.as_("carol")).status_code == 403
    assert c.get(f"{API}/tokens?all=true", headers=world.as_("carol")).status_code == 403
    listed = c.get(f"{API}/tokens?user=carol", headers=world.as_("admin")).json()
    assert [t["id"] for t in listed] == [t["id"] for t in carol]
    everyone = c.get(f"{API}/tokens?all=true", headers=world.as_("admin")).json()
    assert {t["user"] for t in everyone} == {"admin", "alice", "bob", "carol"}
    assert all(t["token"] is None for t in everyone)
    assert c.get(f"{API}/tokens?user=nobody", headers=world.as_("admin")).status_code == 404
    assert c.delete(f"{API}/tokens/{carol[0]['id']}", headers=world.as_("admin")).status_code == 204
    assert c.get(f"{API}/me", headers=world.as_("carol")).status_code == 401


def test_tokens_get_the_default_lifetime_and_no_more_than_the_maximum(world: World) -> None:
    c, alice = world.client, world.as_("alice")
    r = c.post(f"{API}/tokens", json={"name": "default"}, headers=alice)
    assert r.status_code == 201
    assert r.json()["expires_at"] - r.json()["created_at"] == pytest.approx(90 * 86400)
    r = c.post(f"{API}/tokens", json={"name": "long", "expires_in_days": 400}, headers=alice)
    assert r.status_code == 422
    assert (
        "at most 365 days" in r.json()["detail"][0]["msg"]
        and r.json()["detail"][0]["loc"][-1] == "expires_in_days"
    )
    r = c.post(f"{API}/tokens", json={"name": "short", "expires_in_days": 1}, headers=alice)
    assert r.json()["expires_at"] - r.json()["created_at"] == pytest.approx(86400)


def locked_until(world: World, key: str) -> float | None:
    with world.session_factory() as db:
        return db.scalar(
            sa.select(LoginFailure.locked_until).where(
                LoginFailure.scope == "account", LoginFailure.key == key
            )
        )


def not_in(rows: list[dict[str, Any]], text: str) -> bool:
    return text not in repr(rows)
