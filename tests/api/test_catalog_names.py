"""Catalogue names are global, their content private: a create path that meets a name another
user holds answers the same 409 in all four catalogues (templates, models, datasets,
environments), whether or not the caller may see that entry, and says nothing of it
(review104 finding 10; docs/security.md "Catalogue names are global")."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from corral.config import Settings
from corral.db.models import Job
from corral.storage.layout import outputs_dir
from tests.api.conftest import World
from tests.datasets import protocol

API = "/api/v1"
TEMPLATE = {"name": "t", "command": "echo hi", "resources": {"cpus": 1, "memory": "256MiB"}}
ANSWER = (409, "KIND name 'NAME' is taken by another user; choose another")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # A package source, so that POST /environments reaches its name check.
    return Settings(home=tmp_path / "home", database_url="sqlite:///unused", env_find_links=tmp_path)


def _finished_job_with_a_model(world: World, settings: Settings, user: str) -> int:
    r = world.client.post(
        f"{API}/jobs", json={"name": "trainer", "command": "python train.py"}, headers=world.as_(user)
    )
    assert r.status_code == 201, r.text
    job_id = int(r.json()["id"])
    with world.session_factory() as db:
        db.execute(sa.update(Job).where(Job.id == job_id).values(state="succeeded", finished_at=time.time()))
        db.commit()
    model = outputs_dir(settings.storage_path, job_id) / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "weights.bin").write_bytes(b"w")
    return job_id


def _create(world: World, settings: Settings, user: str, kind: str, name: str) -> httpx.Response:
    as_user = world.as_(user)
    if kind == "template":
        body = {"name": name, "spec": TEMPLATE, "visibility": "private"}
        return world.client.post(f"{API}/templates", json=body, headers=as_user)
    if kind == "model":
        job = _finished_job_with_a_model(world, settings, user)
        body = {"job_id": job, "path": "model"}
        return world.client.post(f"{API}/models/{name}/versions", json=body, headers=as_user)
    if kind == "dataset":
        if user == "alice":
            return protocol.push(world.client, as_user, name, {"a.txt": b"private"})
        return protocol.start(world.client, as_user, name, {"b.txt": b"mine"})
    body = {"name": name, "source": "numpy\n", "visibility": "private"}
    return world.client.post(f"{API}/environments", json=body, headers=as_user)


@pytest.mark.parametrize("kind", ["template", "model", "dataset", "environment"])
def test_a_name_another_user_holds_gets_one_answer_in_every_catalogue(
    world: World, settings: Settings, kind: str
) -> None:
    name = f"acquisition-target-{kind}"
    made = _create(world, settings, "alice", kind, name)
    assert made.status_code == 201, made.text
    # carol cannot see alice's private entry: not found, as a missing name
    seen = world.client.get(f"{API}/{kind}s/{name}", headers=world.as_("carol"))
    assert seen.status_code == 404, seen.text
    taken = _create(world, settings, "carol", kind, name)
    detail = taken.json()["detail"].replace(name, "NAME").replace(kind, "KIND")
    assert (taken.status_code, detail) == ANSWER, taken.text
