"""CLI for accounts a new admin needs: default groups, passwords (the portal's login) and tokens
by id, through the SDK against a real uvicorn server."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa
from typer.testing import CliRunner

from corral.cli.common import when
from corral.cli.main import app as cli
from corral.db.audit_models import AuditRecord
from tests.api.conftest import ALICE_PASSWORD, World
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]
API = "/api/v1"


def run_with_stdin(world: World, url: str, user: str, stdin: str, *args: str) -> tuple[int, str]:
    token = world.as_(user)["Authorization"].split()[1]
    result = CliRunner().invoke(cli, list(args), input=stdin, env={"CORRAL_URL": url, "CORRAL_TOKEN": token})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def passwd(world: World, url: str, user: str, stdin: str, *target: str) -> tuple[int, str]:
    return run_with_stdin(world, url, user, stdin, "user", "passwd", *target, "--password-stdin")


def login_status(world: World, user: str, password: str) -> int:
    r = world.client.post(f"{API}/auth/login", json={"username": user, "password": password})
    return r.status_code


def test_cli_default_group(world: World, server_url: str) -> None:
    assert run(world, server_url, "admin", "user", "add-to-group", "carol", "vision")[0] == 0
    code, out = run(world, server_url, "admin", "user", "default-group", "carol", "vision")
    assert code == 0 and "carol's default group is now vision" in out
    code, out = run(world, server_url, "admin", "user", "ls", "-o", "json")
    assert next(u for u in json.loads(out) if u["name"] == "carol")["default_group"] == "vision"
    code, out = run(world, server_url, "carol", "user", "default-group", "carol", "nlp")
    assert code == 0, out
    code, out = run(world, server_url, "carol", "user", "default-group", "alice", "nlp")
    assert code == 1 and "only an administrator" in out
    code, out = run(world, server_url, "admin", "user", "default-group", "alice", "nlp")
    assert code == 1 and "not a member of group 'nlp'" in out


def test_cli_passwd_for_self_and_by_admin(world: World, server_url: str) -> None:
    # carol has no password yet (token-only), so she needs no current one to set it
    code, out = passwd(world, server_url, "carol", "carol-secret-1\n")
    assert code == 0 and "password of carol set" in out
    assert login_status(world, "carol", "carol-secret-1") == 200
    # alice has one: the current password is required
    code, out = passwd(world, server_url, "alice", "alice-new-pass\nwrong\n")
    assert code == 1 and "current password is wrong" in out
    assert login_status(world, "alice", ALICE_PASSWORD) == 200
    stdin = f"alice-new-pass\n{ALICE_PASSWORD}\n"
    code, out = passwd(world, server_url, "alice", stdin)
    assert code == 0, out
    assert login_status(world, "alice", "alice-new-pass") == 200
    assert login_status(world, "alice", ALICE_PASSWORD) == 401
    # others' passwords: admins only; short passwords are refused with the rule
    code, out = passwd(world, server_url, "carol", "bob-password\n", "bob")
    assert code == 1 and "only an administrator" in out
    code, out = passwd(world, server_url, "admin", "short\n", "bob")
    assert code == 1 and "at least 8 characters" in out
    code, out = passwd(world, server_url, "admin", "bob-password\n", "bob")
    assert code == 0, out
    assert login_status(world, "bob", "bob-password") == 200


def test_cli_token_ls_and_revoke(world: World, server_url: str) -> None:
    code, out = run(world, server_url, "alice", "token", "create", "--name", "laptop", "-o", "json")
    created = json.loads(out)
    secret = created["token"]
    code, out = run(world, server_url, "alice", "token", "ls", "-o", "json")
    assert {t["name"] for t in json.loads(out)} == {"test", "laptop"}
    code, out = run(world, server_url, "alice", "token", "ls")
    assert "laptop" in out and secret[:8] in out and secret not in out
    assert world.client.get(f"{API}/me", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    code, out = run(world, server_url, "carol", "token", "revoke", str(created["id"]))
    assert code == 1 and f"no API token with id {created['id']}" in out
    code, out = run(world, server_url, "alice", "token", "revoke", str(created["id"]))
    assert code == 0 and f"token {created['id']} revoked" in out
    assert world.client.get(f"{API}/me", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    code, out = run(world, server_url, "alice", "token", "ls", "-o", "json")
    assert next(t for t in json.loads(out) if t["name"] == "laptop")["revoked_at"] is not None


def test_cli_token_create_and_ls_say_when_a_token_expires(world: World, server_url: str) -> None:
    """A token stops working at its expiry (90 days by default, --expires-in-days), but neither
    `corral token create` nor `corral token ls` said when: a token about to lapse looked like any
    other until a request failed with 401."""
    code, out = run(world, server_url, "alice", "token", "create", "--name", "ci", "--expires-in-days", "0.5")
    assert code == 0, out
    (listed,) = [
        t
        for t in json.loads(run(world, server_url, "alice", "token", "ls", "-o", "json")[1])
        if t["name"] == "ci"
    ]
    stamp = when(listed["expires_at"])
    assert f"token {listed['id']} (ci) expires {stamp}" in out, out
    code, out = run(world, server_url, "alice", "token", "ls")
    assert "EXPIRES" in out and all(part in out for part in stamp.split()), out  # a narrow table wraps
    run(world, server_url, "alice", "token", "create", "--name", "brief", "--expires-in-days", "0.00001")
    time.sleep(1)  # 0.86 s
    code, out = run(world, server_url, "alice", "token", "ls")
    assert "expired" in out, out


def test_cli_token_ls_of_another_user_for_an_admin(world: World, server_url: str) -> None:
    """`corral token revoke ID` revokes anyone's token for an admin, but `corral token ls` listed
    only the admin's own, so the id of a user's lost laptop token was nowhere in the CLI (the API
    has `?user=` and `?all=true`)."""
    code, out = run(world, server_url, "alice", "token", "create", "--name", "laptop", "-o", "json")
    created = json.loads(out)
    code, out = run(world, server_url, "admin", "token", "ls", "--user", "alice", "-o", "json")
    assert code == 0, out
    assert {(t["user"], t["name"]) for t in json.loads(out)} == {("alice", "test"), ("alice", "laptop")}
    code, out = run(world, server_url, "admin", "token", "ls", "--all")
    assert code == 0 and "laptop" in out and "alice" in out and "admin" in out, out
    code, out = run(world, server_url, "carol", "token", "ls", "--user", "alice")
    assert code == 1 and "laptop" not in out, out
    code, out = run(world, server_url, "admin", "token", "revoke", str(created["id"]))
    assert code == 0 and f"token {created['id']} revoked" in out


def test_cli_remove_from_group_and_deactivate(world: World, server_url: str) -> None:
    r = world.client.post(
        f"{API}/jobs",
        json={"name": "j", "command": "true", "resources": {"cpus": 1}},
        headers=world.as_("alice"),
    )
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    code, out = run(world, server_url, "bob", "user", "remove-from-group", "alice", "vision")
    assert code == 1 and f"job {job}" in out and "--cancel-jobs" in out and "Traceback" not in out, out
    assert f"vision': they have live jobs (job {job}); cancel them first" in out, out  # not "live jobs job 1"
    code, out = run(world, server_url, "bob", "user", "remove-from-group", "alice", "vision", "--cancel-jobs")
    assert code == 0 and "alice is no longer a member of vision" in out, out
    code, out = run(world, server_url, "admin", "user", "deactivate", "alice")
    assert code == 0 and "user alice deactivated" in out, out
    code, out = run(world, server_url, "admin", "user", "ls")
    assert "member (deactivated)" in out, out
    code, out = run(world, server_url, "alice", "user", "default-group", "alice", "nlp")
    assert code == 1 and "deactivated" in out, out
    code, out = run(world, server_url, "admin", "user", "activate", "alice")
    assert code == 0 and "user alice activated" in out, out


def test_activating_an_active_user_or_adding_a_member_again_says_nothing_changed(
    world: World, server_url: str
) -> None:
    """`corral user activate alice` of an active alice printed "user alice activated", and `corral
    user add-to-group alice vision` of a member "alice is now member of vision", as though either
    had changed something; the API's answers could not tell either."""
    code, out = run(world, server_url, "admin", "user", "activate", "alice")
    assert code == 0 and "user alice is already active" in out and "activated" not in out, out
    r = world.client.post(f"{API}/users/alice/activate", headers=world.as_("admin"))
    assert r.status_code == 200 and r.json()["changed"] is False, r.text
    assert _user_activity_audited(world) == []  # no change, no audit entry (there were two)
    code, out = run(world, server_url, "admin", "user", "add-to-group", "alice", "vision")
    assert code == 0 and "alice is already member of vision" in out and "now" not in out, out
    r = world.client.post(f"{API}/groups/vision/members", json={"user": "alice"}, headers=world.as_("admin"))
    assert r.json() == {"user": "alice", "role": "member", "changed": False}, r.text
    # a change still says what it did
    code, out = run(world, server_url, "admin", "user", "add-to-group", "alice", "vision", "--admin")
    assert code == 0 and "alice is now admin of vision" in out, out
    code, out = run(world, server_url, "admin", "user", "deactivate", "carol")
    assert code == 0 and "user carol deactivated" in out, out
    code, out = run(world, server_url, "admin", "user", "deactivate", "carol")
    assert code == 0 and "user carol is already deactivated" in out, out
    r = world.client.post(f"{API}/users/carol/activate", headers=world.as_("admin"))
    assert r.json()["changed"] is True and r.json()["active"] is True, r.text
    assert _user_activity_audited(world) == [("user.deactivate", "carol"), ("user.activate", "carol")]


def _user_activity_audited(world: World) -> list[tuple[str, str]]:
    """The user.activate / user.deactivate audit entries, oldest first: (action, user)."""
    with world.session_factory() as db:
        rows = db.scalars(
            sa.select(AuditRecord)
            .where(AuditRecord.action.in_(["user.activate", "user.deactivate"]))
            .order_by(AuditRecord.id)
        ).all()
        return [(r.action, r.target_id) for r in rows]


def test_adding_a_group_admin_again_keeps_their_role_unless_one_is_asked_for(
    world: World, server_url: str
) -> None:
    """`corral user add-to-group bob vision` without `--admin` silently demoted vision's admin bob
    to member (audited admin -> member), and POST /groups/{name}/members answered 201 for a member
    it did not create."""
    code, out = run(world, server_url, "admin", "user", "add-to-group", "bob", "vision")
    assert code == 0 and "bob is already admin of vision (role kept; --member changes it)" in out, out
    r = world.client.post(f"{API}/groups/vision/members", json={"user": "bob"}, headers=world.as_("admin"))
    assert r.status_code == 200 and r.json() == {"user": "bob", "role": "admin", "changed": False}, r.text
    r = world.client.post(f"{API}/groups/nlp/members", json={"user": "bob"}, headers=world.as_("admin"))
    assert r.status_code == 201 and r.json() == {"user": "bob", "role": "member", "changed": True}, r.text
    # an explicit demotion stays possible (vision keeps an admin: alice), and says it changed something
    assert run(world, server_url, "admin", "user", "add-to-group", "alice", "vision", "--admin")[0] == 0
    code, out = run(world, server_url, "admin", "user", "add-to-group", "bob", "vision", "--member")
    assert code == 0 and "bob is now member of vision" in out, out
    both = ("add-to-group", "bob", "vision", "--admin", "--member")
    code, out = run(world, server_url, "admin", "user", *both)
    assert code == 2 and "not both" in out, out
    role_set = {"action": "group.member.role.set"}
    r = world.client.get(f"{API}/audit", params=role_set, headers=world.as_("admin"))
    bobs = [e for e in reversed(r.json()["items"]) if e["after"]["member"] == "bob"]
    roles = [(e["before"]["role"], e["after"]["role"]) for e in bobs]
    assert roles == [("admin", "admin"), ("admin", "admin"), ("admin", "member")], roles


def test_the_last_admin_of_a_group_is_not_demoted_either(world: World, server_url: str) -> None:
    """Removing a group's last admin is refused (409), but `corral user add-to-group bob vision`
    (role member; now `--member`) turned vision's only admin into a member, leaving the group with none."""
    code, out = run(world, server_url, "bob", "user", "add-to-group", "bob", "vision", "--member")
    assert code == 1 and "'bob' cannot stop being an admin of group 'vision': they are its last admin" in out
    code, out = run(world, server_url, "admin", "user", "ls", "-o", "json")
    bob = next(u for u in json.loads(out) if u["name"] == "bob")
    assert {"name": "vision", "role": "admin"} in bob["groups"], bob
    # with another admin, either may step down
    assert run(world, server_url, "bob", "user", "add-to-group", "alice", "vision", "--admin")[0] == 0
    code, out = run(world, server_url, "bob", "user", "add-to-group", "bob", "vision", "--member")
    assert code == 0 and "bob is now member of vision" in out, out
