"""A NUL in a free-text field is a 422 naming the field, never a 500: PostgreSQL stores no NUL in
text (psycopg refuses it), so a template's description, a token's or SSH key's name, a quota's GPU
model, an email or a contact address with one was an unhandled DataError there (SQLite stores it)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import World

API = "/api/v1"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x"
CASES = [
    ("admin", "PUT", "/groups/vision/quota", {"gpu_model": "A\x00", "guaranteed": 1}, "gpu_model"),
    (
        "alice",
        "POST",
        "/templates",
        {"name": "t", "spec": "name: x\ncommand: y\n", "description": "\x00"},
        "description",
    ),
    ("alice", "POST", "/tokens", {"name": "t\x00"}, "name"),
    ("alice", "POST", "/ssh-keys", {"name": "k\x00", "public_key": KEY}, "name"),
    ("alice", "PUT", "/users/alice/email", {"email": "a\x00@x.test"}, "email"),
    ("alice", "POST", "/users/alice/contacts", {"kind": "email", "address": "a\x00@x.test"}, "address"),
]


@pytest.mark.parametrize(("who", "method", "path", "body", "field"), CASES)
def test_a_nul_in_free_text_is_never_a_500(
    world: World, who: str, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    r = world.client.request(method, API + path, json=body, headers=world.as_(who))
    assert r.status_code < 500, r.text
    if r.status_code == 422:  # PostgreSQL
        assert r.json()["detail"][0]["msg"].startswith(f"{field!r} holds a NUL character"), r.text
