"""Secrets for jobs through the API (SQLite and PostgreSQL): who may set, list and delete them,
values never returned, stored encrypted (the column holds no plaintext), submit refuses a job
naming a secret its user may not use, and dispatch decrypts only with the right key."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from corral.config import Settings
from corral.db.models import Job
from corral.db.secrets_models import JobSecret
from corral.services.secrets import SecretBox, SecretKeyError, SecretUnavailable, box_for, grants_for_job
from tests.api.conftest import SIMPLE_JOB, World

VALUE = "wandb-Value-7f3a9c1e"  # looked for everywhere it must not be


def put(world: World, user: str, name: str, value: str, group: str | None = None) -> int:
    params = {"group": group} if group else None
    r = world.client.put(
        f"/api/v1/secrets/{name}", json={"value": value}, params=params, headers=world.as_(user)
    )
    assert VALUE not in r.text
    return r.status_code


def names(world: World, user: str, group: str | None = None) -> list[tuple[str, str, str | None]]:
    r = world.client.get(
        "/api/v1/secrets", params={"group": group} if group else None, headers=world.as_(user)
    )
    assert r.status_code == 200, r.text
    assert VALUE not in r.text
    return [(s["name"], s["scope"], s["group"]) for s in r.json()]


def test_own_secrets_are_write_only_and_stored_encrypted(world: World) -> None:
    assert put(world, "alice", "wandb", VALUE) == 201
    assert put(world, "alice", "wandb", VALUE + "-v2") == 200  # replaced, not duplicated
    assert names(world, "alice") == [("wandb", "user", None)]
    assert names(world, "carol") == []  # another user sees nothing of it
    with world.session_factory() as db:
        row = db.scalars(sa.select(JobSecret)).one()
        raw = db.execute(sa.text("SELECT ciphertext FROM job_secrets")).scalar_one()
    stored = bytes(raw)
    assert VALUE.encode() not in stored and b"wandb-Value" not in stored
    assert len(stored) == 12 + len(VALUE + "-v2") + 16  # nonce + AES-GCM ciphertext + tag
    assert row.updated_by == "alice" and row.user_id is not None and row.group_id is None
    # delete: then gone, and a second delete is a 404 naming it
    r = world.client.delete("/api/v1/secrets/wandb", headers=world.as_("alice"))
    assert r.status_code == 204
    r = world.client.delete("/api/v1/secrets/wandb", headers=world.as_("alice"))
    assert r.status_code == 404 and "wandb" in r.json()["detail"]


def test_group_secrets_are_set_by_group_admins_and_listed_by_members(world: World) -> None:
    assert put(world, "alice", "hub", VALUE, group="vision") == 403  # a member may not set
    assert put(world, "carol", "hub", VALUE, group="vision") == 404  # a non-member: as if no such group
    assert put(world, "bob", "hub", VALUE, group="vision") == 201  # vision's group admin
    assert put(world, "admin", "corp", VALUE, group="nlp") == 201  # a Corral admin, any group
    assert names(world, "alice") == [("hub", "group", "vision")]
    assert names(world, "carol") == [("corp", "group", "nlp")]
    r = world.client.get("/api/v1/secrets", params={"group": "vision"}, headers=world.as_("carol"))
    assert r.status_code == 404 and r.json()["detail"] == "no group named 'vision'"  # as if none existed
    r = world.client.delete("/api/v1/secrets/hub", params={"group": "vision"}, headers=world.as_("alice"))
    assert r.status_code == 403 and "admins" in r.json()["detail"]
    r = world.client.delete("/api/v1/secrets/hub", params={"group": "vision"}, headers=world.as_("bob"))
    assert r.status_code == 204
    assert names(world, "alice") == []


def test_bad_secrets_are_refused_naming_what_is_wrong(world: World) -> None:
    h = world.as_("alice")
    r = world.client.put("/api/v1/secrets/no%20spaces", json={"value": "x"}, headers=h)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["msg"] == (
        "path parameter 'name' 'no spaces' is not a valid name: use 1-64 letters, digits, '.', '_' "
        "or '-', starting with a letter or digit"
    )  # a secret's name follows the catalogues' rule (the same pattern), said in words
    r = world.client.put("/api/v1/secrets/ok", json={"value": ""}, headers=h)
    assert r.status_code == 422 and "empty" in r.text
    r = world.client.put("/api/v1/secrets/ok", json={"value": "a", "value_base64": "YQ=="}, headers=h)
    assert r.status_code == 422 and "exactly one" in r.text
    r = world.client.put("/api/v1/secrets/ok", json={"value_base64": "***"}, headers=h)
    assert r.status_code == 422 and "base64" in r.text
    r = world.client.put(
        "/api/v1/secrets/ok", json={"value_base64": base64.b64encode(b"x" * 65537).decode()}, headers=h
    )
    assert r.status_code == 422 and "at most 65536" in r.text
    r = world.client.put("/api/v1/secrets/ok", json={"value": "x"}, params={"group": "nope"}, headers=h)
    assert r.status_code == 404 and "nope" in r.text


def spec(uses: list[dict[str, str]], group: str | None = None) -> dict[str, object]:
    return {**SIMPLE_JOB, "secrets": uses, **({"group": group} if group else {})}


def test_submit_refuses_a_secret_the_user_may_not_use(world: World) -> None:
    assert put(world, "alice", "wandb", VALUE) == 201
    assert put(world, "bob", "hub", VALUE, group="vision") == 201
    ok = world.client.post(
        "/api/v1/jobs",
        json=spec([{"name": "wandb", "env": "WANDB_API_KEY"}, {"name": "hub", "file": "hub.token"}]),
        headers=world.as_("alice"),
    )
    assert ok.status_code == 201, ok.text
    assert VALUE not in ok.text and ok.json()["spec"]["secrets"][0] == {
        "name": "wandb",
        "env": "WANDB_API_KEY",
    }
    # carol (group nlp) names alice's secret and vision's: refused, naming the secret, revealing nothing
    for use in ({"name": "wandb", "env": "X"}, {"name": "hub", "env": "X"}, {"name": "ghost", "env": "X"}):
        r = world.client.post("/api/v1/jobs", json=spec([use]), headers=world.as_("carol"))
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert err["loc"] == ["body", "secrets", 0, "name"]
        assert f"secret {use['name']!r}" in err["msg"] and "neither you nor group 'nlp'" in err["msg"]
    # scope: group pins the group's secret (alice has none of hers named hub... and vision has no wandb)
    r = world.client.post(
        "/api/v1/jobs",
        json=spec([{"name": "wandb", "env": "X", "scope": "group"}]),
        headers=world.as_("alice"),
    )
    assert r.status_code == 422 and "group 'vision' has none" in r.text
    # spec validation: a reserved variable, a path as file name
    r = world.client.post(
        "/api/v1/jobs", json=spec([{"name": "wandb", "env": "RANK"}]), headers=world.as_("alice")
    )
    assert r.status_code == 422 and "set by Corral" in r.text
    r = world.client.post(
        "/api/v1/jobs", json=spec([{"name": "wandb", "file": "../etc/x"}]), headers=world.as_("alice")
    )
    assert r.status_code == 422 and "plain file name" in r.text


def test_dispatch_decrypts_only_with_the_key_and_while_the_secret_is_usable(
    world: World, settings: Settings, tmp_path: Path
) -> None:
    assert put(world, "alice", "wandb", VALUE) == 201
    assert put(world, "bob", "hub", "hub-value", group="vision") == 201
    r = world.client.post(
        "/api/v1/jobs",
        json=spec([{"name": "wandb", "env": "WANDB_API_KEY"}, {"name": "hub", "file": "hub.token"}]),
        headers=world.as_("alice"),
    )
    job_id = r.json()["id"]
    key_file = settings.home / "secrets.key"  # generated at the first use, 0600
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    box = box_for(settings)
    with world.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        grants = grants_for_job(db, box, job)
        assert [(g.name, g.value, g.env, g.file) for g in grants] == [
            ("wandb", VALUE.encode(), "WANDB_API_KEY", None),
            ("hub", b"hub-value", None, "hub.token"),
        ]
        assert VALUE not in repr(grants)  # the value is kept out of reprs (logs, tracebacks)
        other = SecretBox.from_key(AESGCM.generate_key(bit_length=256))
        with pytest.raises(SecretUnavailable, match="another key"):
            grants_for_job(db, other, job)
        # a ciphertext moved onto another row (or the key id forged) does not open
        rows = {s.name: s for s in db.scalars(sa.select(JobSecret))}
        rows["hub"].ciphertext = rows["wandb"].ciphertext
        with pytest.raises(SecretUnavailable, match="does not decrypt"):
            grants_for_job(db, box, job)
        db.rollback()
    r = world.client.delete("/api/v1/secrets/wandb", headers=world.as_("alice"))
    assert r.status_code == 204
    with world.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        with pytest.raises(SecretUnavailable, match="'wandb'"):
            grants_for_job(db, box, job)
    with pytest.raises(SecretKeyError, match="CORRAL_SECRETS_KEY"):
        box_for(Settings(home=tmp_path / "h2", secrets_key="not-base64!"))
    with pytest.raises(SecretKeyError, match="32 bytes"):
        box_for(Settings(home=tmp_path / "h2", secrets_key=base64.b64encode(b"short").decode()))


def test_a_null_value_field_is_a_clear_422(world: World) -> None:
    """Fuzzing found a 500: `{"value": "0", "value_base64": null}` (pydantic's length check on
    `str | None` raised a TypeError). The schema types both fields as strings."""
    for body in ({"value": "0", "value_base64": None}, {"value": None, "value_base64": "YQ=="}):
        r = world.client.put("/api/v1/secrets/ok", json=body, headers=world.as_("alice"))
        null = next(k for k, v in body.items() if v is None)
        assert r.status_code == 422 and f"'{null}' is null" in r.text, r.text
