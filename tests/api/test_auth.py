"""Login with a session cookie + CSRF, token lifecycle, bootstrap, users, groups, nodes."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from corral.api.routers import tokens as tokens_router
from corral.config import Settings
from corral.db.models import ApiToken, User
from corral.services import accounts, auth
from tests.api.conftest import ALICE_PASSWORD, SIMPLE_JOB, World
from tests.api.helpers import add_node

API = "/api/v1"


def test_portal_login_cookie_and_csrf(world: World) -> None:
    c = world.client
    r = c.post(f"{API}/auth/login", json={"username": "alice", "password": "wrong"})
    assert r.status_code == 401 and "wrong user name or password" in r.json()["detail"]
    assert c.post(f"{API}/auth/login", json={"username": "bob", "password": "x"}).status_code == 401
    r = c.post(f"{API}/auth/login", json={"username": "alice", "password": ALICE_PASSWORD})
    assert r.status_code == 200, r.text
    csrf = r.json()["csrf_token"]
    assert r.json()["user"]["name"] == "alice" and r.json()["user"]["default_group"] == "vision"
    cookie = r.headers["set-cookie"]
    assert "corral_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
    # The TestClient keeps the cookie like a browser would.
    assert c.get(f"{API}/me").json()["name"] == "alice"
    r = c.post(f"{API}/jobs", json=SIMPLE_JOB)
    assert r.status_code == 403 and "X-CSRF-Token" in r.json()["detail"]
    assert c.post(f"{API}/jobs", json=SIMPLE_JOB, headers={"X-CSRF-Token": "forged"}).status_code == 403
    assert c.post(f"{API}/jobs", json=SIMPLE_JOB, headers={"X-CSRF-Token": csrf}).status_code == 201
    assert c.post(f"{API}/auth/logout", headers={"X-CSRF-Token": csrf}).status_code == 204
    c.cookies.clear()
    assert c.get(f"{API}/me").status_code == 401


def test_a_login_from_another_origin_is_refused_and_sets_no_cookie(world: World) -> None:
    """Login CSRF: a page of another site, or of a sibling host of the same site (which
    SameSite=Lax lets through), must not log the browser into its author's account."""
    c = world.client
    login = {"username": "alice", "password": ALICE_PASSWORD}
    for origin in ("https://evil.example", "http://ws.testserver", "http://testserver:8081", "null"):
        r = c.post(f"{API}/auth/login", json=login, headers={"Origin": origin})
        assert r.status_code == 403, (origin, r.text)
        assert r.json()["detail"] == (
            f"login refused: sent from {origin!r}, not from the portal's own origin; "
            "log in on the portal's page"
        )
        assert "set-cookie" not in r.headers and not c.cookies, origin
    # The portal's own page (Origin is the Host it was sent to), and a client sending no Origin.
    own = c.post(f"{API}/auth/login", json=login, headers={"Origin": "http://testserver"})
    assert own.status_code == 200 and "corral_session=" in own.headers["set-cookie"], own.text
    c.cookies.clear()
    bare = c.post(f"{API}/auth/login", json=login)
    assert bare.status_code == 200 and "corral_session=" in bare.headers["set-cookie"], bare.text


def test_a_login_through_a_proxy_that_rewrites_host_is_let_in_by_the_public_url(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """review118 #2: behind a proxy that does not pass Host as the browser sent it (Apache's
    default), the browser's Origin is the portal's public address, not the Host the server sees:
    CORRAL_PUBLIC_URL's origin is the portal's too. A refusal says in the server's log what the
    Origin and Host were, since the browser's answer cannot."""
    c = world.client
    login = {"username": "alice", "password": ALICE_PASSWORD}
    public = {"Origin": "https://corral.example.org"}
    refused = c.post(f"{API}/auth/login", json=login, headers=public)
    assert refused.status_code == 403, refused.text
    said = [r.getMessage() for r in caplog.records if "login refused" in r.getMessage()]
    assert said and "'https://corral.example.org'" in said[-1] and "'testserver'" in said[-1], said
    monkeypatch.setenv("CORRAL_PUBLIC_URL", "https://corral.example.org/")
    let_in = c.post(f"{API}/auth/login", json=login, headers=public)
    # (CORRAL_PUBLIC_URL https: the portal's sessions are https-only, the cookie `__Host-` named)
    assert let_in.status_code == 200 and let_in.headers["set-cookie"].startswith("__Host-corral_session="), (
        let_in.text
    )
    c.cookies.clear()
    sibling = c.post(f"{API}/auth/login", json=login, headers={"Origin": "https://ws.example.org"})
    assert sibling.status_code == 403, sibling.text


def test_a_login_with_a_malformed_bracketed_origin_is_refused_not_a_500(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review127 #1: urlsplit raises ValueError on a malformed `[...]` host (`https://[::1`,
    `http://[x]`); read as an Origin (with or without CORRAL_PUBLIC_URL) that was a 500, not the
    403 naming the origin that any other foreign Origin gets."""
    c = world.client
    login = {"username": "alice", "password": ALICE_PASSWORD}
    for public_url in (None, "https://corral.example.org/"):
        if public_url is not None:
            monkeypatch.setenv("CORRAL_PUBLIC_URL", public_url)
        for origin in ("https://[::1", "http://[x]"):
            refused = c.post(f"{API}/auth/login", json=login, headers={"Origin": origin})
            assert refused.status_code == 403 and origin in refused.text, (public_url, origin, refused.text)


def test_expired_session_is_refused(world: World) -> None:
    with world.session_factory() as db:
        secret, _user, _csrf = auth.login(
            db, "alice", ALICE_PASSWORD, now=time.time() - auth.SESSION_TTL_S - 1
        )
        db.commit()
    world.client.cookies.set("corral_session", secret)
    r = world.client.get(f"{API}/me")
    assert r.status_code == 401 and "expired" in r.json()["detail"]


def test_token_lifecycle(world: World) -> None:
    c = world.client
    r = c.post(f"{API}/tokens", json={"name": "automl"}, headers=world.as_("carol"))
    assert r.status_code == 201
    token = r.json()
    assert token["token"].startswith("crl_") and token["prefix"] == token["token"][:12]
    with world.session_factory() as db:  # only the hash is stored
        stored = db.scalar(sa.select(ApiToken.token_hash).where(ApiToken.id == token["id"]))
        assert stored == auth.sha256_hex(token["token"]) and token["token"] not in str(stored)
    new = {"Authorization": f"Bearer {token['token']}"}
    assert c.get(f"{API}/me", headers=new).json()["name"] == "carol"
    listed = c.get(f"{API}/tokens", headers=new).json()
    assert all(t["token"] is None for t in listed) and len(listed) == 2
    assert c.delete(f"{API}/tokens/{token['id']}", headers=world.as_("carol")).status_code == 204
    r = c.get(f"{API}/me", headers=new)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert c.get(f"{API}/me", headers={"Authorization": "Bearer crl_nope"}).status_code == 401
    assert c.get(f"{API}/me", headers={"Authorization": "Basic abc"}).status_code == 401
    r = c.post(f"{API}/tokens", json={"name": "x", "user": "alice"}, headers=world.as_("carol"))
    assert r.status_code == 403
    r = c.post(f"{API}/tokens", json={"name": "x", "user": "alice"}, headers=world.as_("admin"))
    assert r.json()["user"] == "alice"
    with world.session_factory() as db:
        row = db.get(ApiToken, r.json()["id"])
        assert row is not None
        row.expires_at = time.time() - 1
        db.commit()
    r = c.get(f"{API}/me", headers={"Authorization": f"Bearer {r.json()['token']}"})
    assert r.status_code == 401 and "expired" in r.json()["detail"]


def test_a_token_used_while_its_revoke_commits_is_not_cached_past_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request with the token between the revoke's change and its commit still reads it as
    valid (the change is not committed yet): that principal must not stay in the cache, or the
    revoked token kept working for up to PRINCIPAL_CACHE_S after the revoke was answered."""
    c = world.client
    token = c.post(f"{API}/tokens", json={"name": "leaked"}, headers=world.as_("carol")).json()
    leaked = {"Authorization": f"Bearer {token['token']}"}
    # Used once before: the lookup below then writes nothing (last_used_at is recent), which on
    # the revoke's locked row would wait for its commit.
    assert c.get(f"{API}/me", headers=leaked).status_code == 200
    seen: list[int] = []
    record = tokens_router.audit.record

    def record_then_use(*args: object, **kwargs: object) -> None:
        record(*args, **kwargs)  # type: ignore[arg-type]
        if not seen:  # the revoke's own transaction is still open: a request comes in now
            seen.append(c.get(f"{API}/me", headers=leaked).status_code)

    monkeypatch.setattr(tokens_router.audit, "record", record_then_use)
    assert c.delete(f"{API}/tokens/{token['id']}", headers=world.as_("carol")).status_code == 204
    assert seen == [200]  # before the commit: still valid, as the database says
    r = c.get(f"{API}/me", headers=leaked)
    assert r.status_code == 401 and "revoked" in r.json()["detail"], r.text


def test_a_login_costs_one_password_check_whether_the_name_exists_or_not(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer does not say which names exist (docs/security.md), and neither may its speed:
    an unknown name, or an account without a password (bob), was refused without the argon2
    check a wrong password costs, so a fast refusal named a free name."""
    checks: list[str] = []
    hasher = auth._hasher

    class Counted:
        def hash(self, password: str) -> str:
            return hasher.hash(password)

        def verify(self, stored: str, password: str) -> bool:
            checks.append(password)
            return hasher.verify(stored, password)

    monkeypatch.setattr(auth, "_hasher", Counted())
    with world.session_factory() as db:
        for name in ("alice", "bob", "nobody"):
            with pytest.raises(auth.WrongPassword):
                auth.login(db, name, f"{name}-guess")
    assert checks == ["alice-guess", "bob-guess", "nobody-guess"]
    with world.session_factory() as db:
        secret, user, _csrf = auth.login(db, "alice", ALICE_PASSWORD)
        assert user.name == "alice" and secret


def test_bootstrap_admin_only_once(world: World) -> None:
    with world.session_factory() as db:
        assert auth.bootstrap_admin(db, Settings()) is None  # users exist already


def test_users_groups_and_quotas(world: World) -> None:
    c, admin = world.client, world.as_("admin")
    r = c.post(
        f"{API}/users",
        json={
            "name": "dave",
            "groups": ["nlp", "vision"],
            "default_group": "vision",
            "password": "dave-password",
        },
        headers=admin,
    )
    assert r.status_code == 201, r.text
    assert r.json()["default_group"] == "vision"
    assert {g["name"] for g in r.json()["groups"]} == {"nlp", "vision"}
    assert c.post(f"{API}/users", json={"name": "dave"}, headers=admin).status_code == 409
    r = c.post(f"{API}/users", json={"name": "Bad Name"}, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]
    r = c.post(f"{API}/users", json={"name": "eve", "password": "short"}, headers=admin)
    assert r.status_code == 422 and "at least 8 characters" in r.json()["detail"][0]["msg"]
    r = c.put(f"{API}/users/alice/default-group", json={"group": "nlp"}, headers=admin)
    assert r.status_code == 409 and "not a member" in r.json()["detail"]  # a state conflict, not a bad field
    # To alice herself, a group she is not in reads as one that does not exist (it may not be hers
    # to know of): the same 404 as for a name no group has (docs/architecture.md).
    r = c.put(f"{API}/users/alice/default-group", json={"group": "nlp"}, headers=world.as_("alice"))
    assert r.status_code == 404 and r.json()["detail"] == "no group named 'nlp'"
    r = c.post(
        f"{API}/groups",
        json={"name": "speech", "quotas": [{"gpu_model": "A100", "guaranteed": 4}]},
        headers=admin,
    )
    assert r.status_code == 201 and r.json()["quotas"] == [
        {"gpu_model": "A100", "guaranteed": 4, "max": None}
    ]
    assert c.post(f"{API}/groups", json={"name": "speech"}, headers=admin).status_code == 409
    r = c.put(
        f"{API}/groups/speech/quota",
        json={"gpu_model": "A100", "guaranteed": 2, "max": 8, "user_max_gpus": 2},
        headers=admin,
    )
    assert r.json()["quotas"] == [{"gpu_model": "A100", "guaranteed": 2, "max": 8}]
    assert r.json()["user_max_gpus"] == 2
    r = c.put(f"{API}/groups/speech/quota", json={"guaranteed": 5, "max": 1}, headers=admin)
    assert r.status_code == 422 and "must not be less than guaranteed" in r.json()["detail"][0]["msg"]
    r = c.post(
        f"{API}/groups/vision/members", json={"user": "carol", "role": "admin"}, headers=world.as_("bob")
    )
    assert r.status_code == 201 and r.json() == {"user": "carol", "role": "admin", "changed": True}
    me = c.get(f"{API}/me", headers=world.as_("carol")).json()
    assert me["role"] == "group_admin" and {"name": "vision", "role": "admin"} in me["groups"]
    assert me["default_group"] == "nlp"
    groups = c.get(f"{API}/groups", headers=world.as_("alice")).json()
    assert [g["name"] for g in groups] == ["vision"] and groups[0]["members"] is None


def test_node_admin_actions(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, "n1")
        add_node(db, "n2", state="down")
        db.commit()
    c, admin = world.client, world.as_("admin")
    r = c.post(f"{API}/nodes/n1/cordon", headers=admin)
    assert (r.json()["state"], r.json()["admin_state"]) == ("cordoned", "cordoned")
    r = c.post(f"{API}/nodes/n1/drain", headers=admin)
    assert (r.json()["state"], r.json()["admin_state"]) == ("draining", "draining")
    r = c.post(f"{API}/nodes/n1/uncordon", headers=admin)
    assert (r.json()["state"], r.json()["admin_state"]) == ("ready", "none")
    r = c.post(f"{API}/nodes/n2/cordon", headers=admin)
    assert (r.json()["state"], r.json()["admin_state"]) == ("down", "cordoned")  # down stays down
    assert c.post(f"{API}/nodes/nope/cordon", headers=admin).status_code == 404
    assert c.post(f"{API}/nodes/n1/reboot", headers=admin).status_code == 422


def test_ssh_keys(world: World) -> None:
    c = world.client
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq0xQh4sLrXGzV3bP9yKo6e0mmXo0e1n8z9F3N0bQn+ me@x"
    r = c.post(f"{API}/ssh-keys", json={"name": "laptop", "public_key": key}, headers=world.as_("alice"))
    assert r.status_code == 201 and r.json()["fingerprint"].startswith("SHA256:")
    dup = c.post(f"{API}/ssh-keys", json={"name": "again", "public_key": key}, headers=world.as_("alice"))
    assert dup.status_code == 409
    r = c.post(f"{API}/ssh-keys", json={"name": "bad", "public_key": "hello"}, headers=world.as_("alice"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "public_key"]
    assert c.get(f"{API}/ssh-keys", headers=world.as_("bob")).json() == []


@pytest.mark.parametrize(
    "damaged",
    [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA me@x",  # the type's name and nothing of the key
        "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIGq0xQh4sLrXGzV3bP9yKo6e0mmXo0e1n8z9F3N0bQn+ me@x",  # not RSA
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq0xQh4sLrXGzV3bP9yKo6e0mmXo0e1n8z9 me@x",  # cut short
    ],
)
def test_a_key_whose_bytes_are_not_a_whole_key_of_its_type_is_refused(world: World, damaged: str) -> None:
    """docs/workspaces.md: a malformed key is refused (422). One whose base64 was valid but whose
    bytes were not a key of the type it names was registered, and the gateway never matched it."""
    r = world.client.post(
        f"{API}/ssh-keys", json={"name": "bad", "public_key": damaged}, headers=world.as_("alice")
    )
    assert r.status_code == 422, r.text
    assert "the SSH public key is damaged" in r.text
    assert r.json()["detail"][0]["loc"] == ["body", "public_key"]
    assert world.client.get(f"{API}/ssh-keys", headers=world.as_("alice")).json() == []


def test_user_list_matches_each_users_view(world: World) -> None:
    """GET /users builds every view from three queries; each must equal the one-user view."""
    c, admin = world.client, world.as_("admin")
    new = {"name": "dave", "groups": ["vision", "nlp"], "default_group": "nlp"}
    assert c.post(f"{API}/users", json=new, headers=admin).status_code == 201
    listed = c.get(f"{API}/users", headers=admin).json()
    with world.session_factory() as db:
        users = db.scalars(sa.select(User).order_by(User.name)).all()
        expected = [accounts.user_out(db, u) for u in users]
    assert [u["name"] for u in listed] == ["admin", "alice", "bob", "carol", "dave"]
    assert listed == expected
    bob = next(u for u in listed if u["name"] == "bob")
    assert bob["role"] == "group_admin" and bob["groups"] == [{"name": "vision", "role": "admin"}]
    dave = next(u for u in listed if u["name"] == "dave")
    assert [g["name"] for g in dave["groups"]] == ["nlp", "vision"] and dave["default_group"] == "nlp"


def test_session_csrf_is_read_again_with_the_cookie_only(world: World) -> None:
    """The portal keeps its CSRF token in memory only (never localStorage, which any script of the
    origin could read, docs/security.md); after a reload it reads it from GET /auth/csrf."""
    c = world.client
    r = c.post(f"{API}/auth/login", json={"username": "alice", "password": ALICE_PASSWORD})
    assert r.status_code == 200, r.text
    csrf = r.json()["csrf_token"]
    r = c.get(f"{API}/auth/csrf")
    assert r.status_code == 200 and r.json() == {"csrf_token": csrf}
    assert (
        c.post(f"{API}/jobs", json=SIMPLE_JOB, headers={"X-CSRF-Token": r.json()["csrf_token"]}).status_code
        == 201
    )
    c.cookies.clear()
    assert c.get(f"{API}/auth/csrf").status_code == 401
    r = c.get(f"{API}/auth/csrf", headers=world.as_("alice"))
    assert r.status_code == 409 and "only a portal session" in r.json()["detail"]
