"""The server's open sessions (exec, SSH, workspace proxy WebSockets) end when what holds them
open loses access: corral.services.open_sessions.OpenSessions.check against the database."""

from __future__ import annotations

import time

from sqlalchemy import select

from corral.db.models import ApiToken, User
from corral.services.open_sessions import Holder, OpenSessions
from tests.api.conftest import ALICE_PASSWORD, World
from tests.api.test_audit import ssh_key

API = "/api/v1"


def test_a_check_ends_the_sessions_of_revoked_credentials_and_deactivated_users(world: World) -> None:
    w = world
    r = w.client.post(f"{API}/ssh-keys", json={"name": "k", "public_key": ssh_key()}, headers=w.as_("alice"))
    assert r.status_code == 201, r.text
    fingerprint, key_id = r.json()["fingerprint"], r.json()["id"]
    r = w.client.post(f"{API}/auth/login", json={"username": "alice", "password": ALICE_PASSWORD})
    assert r.status_code == 200, r.text
    w.client.cookies.clear()
    with w.session_factory() as db:
        rows = db.execute(select(User.name, ApiToken.id).join(User, User.id == ApiToken.user_id))
        tokens = dict(rows.all())
    sessions = w.client.get(f"{API}/sessions", headers=w.as_("admin"), params={"user": "alice"}).json()
    portal = f"session:{sessions[0]['id']}"
    ended: list[str] = []
    open_sessions = OpenSessions()
    held = {
        "bob token": Holder("bob", f"token:{tokens['bob']}"),
        "carol token": Holder("carol", f"token:{tokens['carol']}"),
        "alice key": Holder("alice", f"ssh-key:{fingerprint}"),
        "alice portal": Holder("alice", portal),
        "alice token": Holder("alice", f"token:{tokens['alice']}"),
        "alice key to bob": Holder("bob", f"ssh-key:{fingerprint}"),  # not bob's key
    }
    for name, holder in held.items():
        open_sessions.add(holder, lambda name=name: ended.append(name))

    def check() -> list[str]:
        with w.session_factory() as db:
            open_sessions.check(db, time.time())
        out = sorted(ended)
        ended.clear()
        return out

    assert check() == ["alice key to bob"]  # a key opens only its own user's sessions
    assert w.client.delete(f"{API}/tokens/{tokens['carol']}", headers=w.as_("admin")).status_code == 204
    assert check() == ["carol token"]
    assert w.client.delete(f"{API}/ssh-keys/{key_id}", headers=w.as_("alice")).status_code == 204
    assert check() == ["alice key"]
    assert w.client.post(f"{API}/users/alice/deactivate", headers=w.as_("admin")).status_code == 200
    assert check() == ["alice portal", "alice token"]
    assert open_sessions.holders() == {held["bob token"]}
