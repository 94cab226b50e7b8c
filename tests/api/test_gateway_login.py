"""The SSH gateway's login steps against the database (SQLite and PostgreSQL): whose keys may log
in, and what a login name resolves to (corral.gateway.resolver). The SSH side itself is in
tests/gateway/ and tests/server/test_sandbox_entry.py."""

from __future__ import annotations

import asyncio
import time

import asyncssh
import pytest
import sqlalchemy as sa

from corral.config import Settings
from corral.db.models import User
from corral.gateway import resolver
from corral.gateway.ssh import Gateway, GatewayServer
from corral.services.errors import NotFound, ServiceError
from corral.services.open_sessions import Holder, good_holders
from tests.api.conftest import World
from tests.api.helpers import add_node
from tests.server.fakes import FakeEngine


def test_a_deactivated_users_keys_open_nothing(world: World) -> None:
    """A deactivated user can no longer log in or use a token or session: nor SSH (the keys
    are read at each login, and resolver.authorized_keys says "none for a disabled user")."""
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    added = world.client.post(
        "/api/v1/ssh-keys", json={"name": "laptop", "public_key": key}, headers=world.as_("alice")
    )
    assert added.status_code == 201, added.text
    with world.session_factory() as db:
        assert resolver.authorized_keys(db, "alice") == [key]
        db.execute(sa.update(User).where(User.name == "alice").values(active=False))
        db.commit()
    with world.session_factory() as db:
        assert resolver.authorized_keys(db, "alice") == []
        with pytest.raises(ServiceError, match="deactivated"):
            resolver.principal_for(db, "alice", "127.0.0.1")


def test_ids_beyond_the_databases_range_are_not_found(world: World) -> None:
    """A workspace or job id no row can have (ids are 32-bit in PostgreSQL; SQLite takes 64
    bits) answers 404 naming it, through the proxy, the exec WebSocket and the gateway, instead
    of a database error (a 500, a WebSocket closed without a word, an SSH channel that hangs)."""
    huge = 99_999_999_999_999_999_999
    r = world.client.get(f"/ws/{huge}/lab", headers=world.as_("alice"))
    assert r.status_code == 404 and f"no workspace {huge}" in r.json()["detail"]
    world.client.app.state.engine = FakeEngine()  # type: ignore[attr-defined]  # exec needs one
    with world.client.websocket_connect(f"/api/v1/jobs/{huge}/exec", headers=world.as_("alice")) as ws:
        ws.send_json({"argv": ["true"]})
        answer = ws.receive_json()
    assert answer["status"] == 404 and str(huge) in answer["error"]
    with world.session_factory() as db:
        alice = resolver.principal_for(db, "alice", "127.0.0.1")
        with pytest.raises(NotFound, match="9999999999"):
            resolver.resolve(db, alice, resolver.parse_login("alice+job-9999999999"))


def test_a_workspace_not_running_is_refused_saying_whether_it_starts_or_is_stopped(world: World) -> None:
    """`ssh alice+nb@...` into a workspace whose job was still queued said "workspace 'nb' is
    stopped: start it with `corral ws start`", and that start is refused (it is running)."""
    with world.session_factory() as db:
        add_node(db)
        db.commit()
    created = world.client.post("/api/v1/workspaces", json={"name": "nb"}, headers=world.as_("alice"))
    assert created.status_code == 201, created.text
    job_id = created.json()["job_id"]
    login = resolver.parse_login("alice+nb")
    with world.session_factory() as db:
        alice = resolver.principal_for(db, "alice", "127.0.0.1")
        with pytest.raises(NotFound) as starting:
            resolver.resolve(db, alice, login)
    assert starting.value.message == (
        f"workspace 'nb' is starting (job {job_id}), not running yet: try again once "
        "`corral ws show nb` says running"
    )
    assert world.client.post("/api/v1/workspaces/nb/stop", headers=world.as_("alice")).status_code == 200
    with world.session_factory() as db:
        with pytest.raises(NotFound) as stopped:
            resolver.resolve(db, alice, login)
        with pytest.raises(NotFound) as unknown:
            resolver.resolve(db, alice, resolver.parse_login("alice+other"))
    assert stopped.value.message == "workspace 'nb' is stopped: start it with `corral ws start nb`"
    assert unknown.value.message == "unknown workspace 'other' of alice: `corral ws ls` lists yours"


def test_another_users_key_learns_nothing_of_a_workspace_by_logging_in_to_it(
    world: World, settings: Settings
) -> None:
    """`ssh alice+nb@...` with bob's key: refused at authentication, before any workspace is
    looked up (the keys that may log in are the login's user's, alice's), so alice's `nb` and a
    name she never used are refused alike: the gateway does not disclose which exist."""
    bob_key = asyncssh.generate_private_key("ssh-ed25519")
    public = bob_key.export_public_key().decode().strip()
    added = world.client.post(
        "/api/v1/ssh-keys", json={"name": "laptop", "public_key": public}, headers=world.as_("bob")
    )
    assert added.status_code == 201, added.text
    created = world.client.post(
        "/api/v1/workspaces", json={"name": "nb", "start": False}, headers=world.as_("alice")
    )
    assert created.status_code == 201, created.text
    gateway = Gateway(settings, world.session_factory, FakeEngine())
    try:
        answers = []
        for login in ("alice+nb", "alice+never-made", "bob+nb"):
            server = GatewayServer(gateway)
            asyncio.run(server.begin_auth(login))
            answers.append(server.validate_public_key(login, bob_key))
    finally:
        gateway.loop.close()
    assert answers == [False, False, True]  # bob's key opens only bob's logins


def test_two_users_may_register_one_public_key_and_each_logs_in_only_as_themself(
    world: World, settings: Settings
) -> None:
    """Public keys are public (github.com/<user>.keys): bob registering alice's key first once
    locked her out of it (review104 finding 8). The gateway takes the user from the login name
    and checks that user's keys only, so a key opens only the accounts that registered it, and
    removing one registration ends only that account's sessions."""
    alice_key = asyncssh.generate_private_key("ssh-ed25519")
    bob_key = asyncssh.generate_private_key("ssh-ed25519")
    alice_public = alice_key.export_public_key().decode().strip()
    bob_public = bob_key.export_public_key().decode().strip()
    posts = [("bob", alice_public), ("alice", alice_public), ("bob", bob_public), ("carol", bob_public)]
    ids = {}
    for user, public in posts:
        r = world.client.post(
            "/api/v1/ssh-keys", json={"name": "laptop", "public_key": public}, headers=world.as_(user)
        )
        assert r.status_code == 201, (user, r.text)
        ids[user, public] = r.json()["id"]
    again = world.client.post(
        "/api/v1/ssh-keys", json={"name": "again", "public_key": alice_public}, headers=world.as_("alice")
    )
    assert again.status_code == 409 and "already registered to your account" in again.json()["detail"]
    gateway = Gateway(settings, world.session_factory, FakeEngine())
    try:
        answers = {}
        for login in ("alice+nb", "carol+nb", "admin+nb"):
            for who, key in (("alice", alice_key), ("bob", bob_key)):
                server = GatewayServer(gateway)
                asyncio.run(server.begin_auth(login))
                answers[login, who] = server.validate_public_key(login, key)
    finally:
        gateway.loop.close()
    # bob's key opens carol's account (she registered it) but never alice's; alice's key never
    # carol's; an account that registered neither key opens to neither.
    assert answers == {
        ("alice+nb", "alice"): True,
        ("alice+nb", "bob"): False,
        ("carol+nb", "alice"): False,
        ("carol+nb", "bob"): True,
        ("admin+nb", "alice"): False,
        ("admin+nb", "bob"): False,
    }
    fp = alice_key.get_fingerprint("sha256")
    holders = {Holder("alice", f"ssh-key:{fp}"), Holder("bob", f"ssh-key:{fp}")}
    removed = world.client.delete(f"/api/v1/ssh-keys/{ids['bob', alice_public]}", headers=world.as_("bob"))
    assert removed.status_code == 204
    with world.session_factory() as db:
        assert good_holders(db, holders, time.time()) == {Holder("alice", f"ssh-key:{fp}")}
        assert resolver.authorized_keys(db, "bob") == [bob_public]
        assert resolver.authorized_keys(db, "alice") == [alice_public]
