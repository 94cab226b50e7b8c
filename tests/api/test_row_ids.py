"""Rows removed by id never give their id to another row (migration 0025_row_ids): SSH keys
(`corral key rm ID`) and on-call overrides (`corral oncall schedule rm-override NAME ID`). On
SQLite a plain INTEGER PRIMARY KEY is max(rowid)+1: the newest removed id went to the next row,
and an admin's retried removal then removed that one. PostgreSQL's sequence never reused ids."""

from __future__ import annotations

import time

import asyncssh

from tests.api.conftest import World

API = "/api/v1"


def _key() -> str:
    return str(asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip())


def test_a_removed_ssh_keys_id_is_never_given_again(world: World) -> None:
    c, alice = world.client, world.as_("alice")
    ids = []
    for name in ("a", "b"):
        r = c.post(f"{API}/ssh-keys", json={"name": name, "public_key": _key()}, headers=alice)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    assert c.delete(f"{API}/ssh-keys/{ids[-1]}", headers=alice).status_code == 204
    new = c.post(f"{API}/ssh-keys", json={"name": "c", "public_key": _key()}, headers=alice).json()["id"]
    assert new > max(ids), f"keys {ids}, the newest removed, then key {new}"
    # the retried removal finds nothing, and the new key stays
    assert c.delete(f"{API}/ssh-keys/{ids[-1]}", headers=alice).status_code == 404
    assert new in [k["id"] for k in c.get(f"{API}/ssh-keys", headers=alice).json()]


def test_a_removed_overrides_id_is_never_given_again(world: World) -> None:
    c, admin = world.client, world.as_("admin")
    layer = {"rotation": "daily", "start_date": "2026-01-05", "members": ["admin"]}
    assert c.put(f"{API}/oncall/schedules/s", json={"layers": [layer]}, headers=admin).status_code < 300
    body = {"user": "admin", "start": time.time(), "end": time.time() + 3600}
    ids = []
    for _ in range(2):
        r = c.post(f"{API}/oncall/schedules/s/overrides", json=body, headers=admin)
        assert r.status_code < 300, r.text
        ids.append(r.json()["id"])
    assert c.delete(f"{API}/oncall/schedules/s/overrides/{ids[-1]}", headers=admin).status_code < 300
    new = c.post(f"{API}/oncall/schedules/s/overrides", json=body, headers=admin).json()["id"]
    assert new > max(ids), f"overrides {ids}, the newest removed, then override {new}"
    assert c.delete(f"{API}/oncall/schedules/s/overrides/{ids[-1]}", headers=admin).status_code == 404
