"""A version number is never given twice for a name, even across deleting the dataset, model or
environment and creating one again with that name (corral.catalog.retired): `NAME@1` as a job's
spec or a model's lineage recorded it never names other content."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from corral.db.environment_models import Environment, EnvironmentVersion
from corral.db.models import User
from corral.environments import service as environments
from corral.services.auth import load_principal
from tests.api.conftest import World
from tests.api.test_catalog import finished_job
from tests.datasets import protocol

API = "/api/v1"


def _versions(w: World, kind: str, name: str, user: str = "alice") -> list[int]:
    r = w.client.get(f"{API}/{kind}/{name}", headers=w.as_(user))
    assert r.status_code == 200, r.text
    return [v["version"] for v in r.json()["versions"]]


def test_a_dataset_made_again_goes_on_from_the_deleted_ones_number(world: World) -> None:
    w, alice = world, world.as_("alice")
    for n in (1, 2, 3):
        assert protocol.push(w.client, alice, "d", {"x.txt": b"v%d" % n}).json()["version"] == n
    assert w.client.delete(f"{API}/datasets/d", headers=alice).status_code == 204
    # Another user takes the free name: the numbers go on all the same.
    r = protocol.push(w.client, w.as_("carol"), "d", {"x.txt": b"other data"})
    assert r.json()["version"] == 4, r.text  # was 1: `d@1` named other data
    assert _versions(w, "datasets", "d", "carol") == [4]
    assert w.client.get(f"{API}/datasets/d/versions/1/manifest", headers=w.as_("carol")).status_code == 404
    assert w.client.delete(f"{API}/datasets/d", headers=w.as_("carol")).status_code == 204
    assert protocol.push(w.client, alice, "d", {"x.txt": b"again"}).json()["version"] == 5


def test_a_model_registered_again_goes_on_from_the_deleted_ones_number(world: World, settings: Any) -> None:
    w, alice, root = world, world.as_("alice"), settings.storage_path
    for version in (1, 2):
        job = finished_job(w, "alice", {"w.bin": b"%d" % version}, root)
        r = w.client.post(f"{API}/models/m/versions", json={"job_id": job}, headers=alice)
        assert r.status_code == 201 and r.json()["version"] == version, r.text
    assert w.client.delete(f"{API}/models/m", headers=alice).status_code == 204
    job = finished_job(w, "alice", {"w.bin": b"new"}, root)
    r = w.client.post(f"{API}/models/m/versions", json={"job_id": job}, headers=alice)
    assert r.status_code == 201 and r.json()["version"] == 3, r.text
    assert _versions(w, "models", "m") == [3]


def _failed_versions(w: World, name: str, numbers: tuple[int, ...]) -> None:
    with w.session_factory() as db:
        owner = db.scalar(sa.select(User.id).where(User.name == "alice"))
        env = Environment(name=name, owner_id=owner, visibility="private", official=False, created_at=1.0)
        db.add(env)
        db.flush()
        for number in numbers:
            db.add(
                EnvironmentVersion(
                    environment_id=env.id, version=number, state="failed", source_kind="requirements",
                    source="x", python="3", created_by="alice", created_at=1.0,
                )
            )  # fmt: skip
        env.last_version = max(numbers)
        db.commit()


def _next_version(w: World, name: str) -> int:
    """The number `POST /environments` would give now (its build needs a package index and an
    interpreter, which this test has not: the numbering step alone)."""
    with w.session_factory() as db:
        user = db.scalar(sa.select(User).where(User.name == "alice"))
        assert user is not None
        alice = load_principal(db, user, via="token")
        req = environments.CreateRequest(name=name, source="numpy\n")
        env = environments._upsert_environment(db, alice, req, None)
        version = environments._new_version(db, alice, env, req, "/usr/bin/python3", "3")
        version.state = "failed"  # as if its build had ended, so that the test may delete it
        db.commit()
        return version.version


def test_an_environment_never_gives_a_number_twice(world: World) -> None:
    w, alice = world, world.as_("alice")
    _failed_versions(w, "e", (1, 2))
    r = w.client.delete(f"{API}/environments/e", params={"version": 2}, headers=alice)
    assert r.status_code == 204, r.text
    assert _next_version(w, "e") == 3  # was 2 again: the latest's number given twice
    r = w.client.delete(f"{API}/environments/e", headers=alice)
    assert r.status_code == 204, r.text
    assert _next_version(w, "e") == 4  # was 1: `environment: e@1` named another build
    assert _versions(w, "environments", "e") == [4]


def test_a_template_published_again_goes_on_from_the_deleted_ones_number(world: World) -> None:
    w, alice = world, world.as_("alice")
    spec = {
        "name": "t",
        "command": "echo ${word}",
        "parameters": {"word": {"type": "string", "default": "hi"}},
    }
    for version in (1, 2):
        r = w.client.post(f"{API}/templates", json={"name": "t", "spec": spec}, headers=alice)
        assert r.status_code == 201 and r.json()["version"] == version, r.text
    assert w.client.delete(f"{API}/templates/t", headers=alice).status_code == 204
    r = w.client.post(f"{API}/templates", json={"name": "t", "spec": spec}, headers=w.as_("carol"))
    assert r.status_code == 201 and r.json()["version"] == 3, r.text  # was 1: `--version 1` changed
