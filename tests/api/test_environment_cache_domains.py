"""A store copy made from one user's build is never another user's cache hit (review104, finding
2). The build job runs as its submitter, who can change what it leaves in its outputs (on Slurm
from their login shell; on the local engine a shell in it was possible until finding 4): alice's
edited venv of `wheel==0.43.0` became the copy an admin's official environment of the same pins
shared, and bob's job in it ran her code. Copies are now keyed in the build's cache domain: the
submitter's own for a user, `shared` for an admin; a user's build may still use an admin's copy.

Each build job here "runs" by writing its outputs by hand, as the real build step (or its owner)
would, then ends; the env-builds loop's settle_builds is the real one, on a real store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corral.db.models import Job
from corral.environments.builds import settle_builds
from corral.environments.buildstep import CACHE_DOMAIN_ENV, HIT_MARKER, LOCK_FILE, VENV_DIR
from corral.environments.store import copy_dir
from corral.storage.layout import outputs_dir
from tests.api.conftest import World
from tests.api.helpers import add_node

API = "/api/v1"
LOCK = "wheel==0.43.0\n"
INIT = "lib/python3/site-packages/wheel/__init__.py"


def _root(w: World) -> Path:
    settings = w.client.app.state.settings  # type: ignore[attr-defined]
    settings.env_find_links = settings.home / "wheels"  # builds need a package source
    return Path(settings.storage_path)


def _build(w: World, who: str, name: str, venv_init: str | None, **extra: Any) -> dict[str, Any]:
    """`who` creates environment `name` from LOCK; its build job leaves the lock and either a
    venv whose wheel/__init__.py is `venv_init`, or (None) the build step's cache-hit marker;
    the job succeeds and the version is settled. Returns the version's view."""
    root = _root(w)
    created = w.client.post(
        f"{API}/environments", json={"name": name, "source": "wheel\n", **extra}, headers=w.as_(who)
    )
    assert created.status_code == 201, created.text
    job_id = int(created.json()["build_job_id"])
    out = outputs_dir(root, job_id)
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_FILE).write_text(LOCK)
    if venv_init is None:
        (out / HIT_MARKER).write_text("claimed\n")
    else:
        init = out / VENV_DIR / INIT
        init.parent.mkdir(parents=True)
        init.write_text(venv_init)
    with w.session_factory() as db:
        db.execute(sa.update(Job).where(Job.id == job_id).values(state="succeeded", finished_at=time.time()))
        db.commit()
        assert settle_builds(db, root, None, time.time()) == 1
    shown = w.client.get(f"{API}/environments/{name}", headers=w.as_(who))
    assert shown.status_code == 200, shown.text
    version: dict[str, Any] = shown.json()["versions"][-1]
    assert version["state"] == "ready", version
    return version


def _copy_text(w: World, key: str) -> str:
    return (copy_dir(_root(w), key) / INIT).read_text()


def test_a_users_edited_build_is_no_one_elses_cache_hit(world: World) -> None:
    w = world
    with w.session_factory() as db:
        add_node(db)
        db.commit()
    poisoned = 'print("POISONED-BY-ALICE")\n'
    alice = _build(w, "alice", "pa3", poisoned)
    assert alice["cache_hit"] is False and _copy_text(w, alice["cache_key"]) == poisoned

    bob = _build(w, "bob", "pb", "# bob's clean wheel\n")  # the same pins, another user
    assert bob["cache_hit"] is False, bob
    assert bob["cache_key"] != alice["cache_key"]
    assert _copy_text(w, bob["cache_key"]) == "# bob's clean wheel\n"

    official = _build(
        w, "admin", "official-wheel", "# the admin's wheel\n", visibility="public", official=True
    )
    assert official["cache_hit"] is False, official
    assert official["cache_key"] not in (alice["cache_key"], bob["cache_key"])
    assert _copy_text(w, official["cache_key"]) == "# the admin's wheel\n"

    # Within one domain the cache works as before: alice's second build shares her own copy.
    again = _build(w, "alice", "pa4", None)
    assert again["cache_hit"] is True and again["cache_key"] == alice["cache_key"], again
    # A user's build may share an admin's copy (carol's own domain has none).
    carol = _build(w, "carol", "pc", None)
    assert carol["cache_hit"] is True and carol["cache_key"] == official["cache_key"], carol


def test_the_build_job_carries_its_cache_domain(world: World) -> None:
    """The domain is the server's, written into the build job's spec at submit (which no user
    can change): the submitter's own for a user, `shared` for an admin."""
    _root(world)
    with world.session_factory() as db:
        add_node(db)
        db.commit()
    domains = {}
    for who in ("alice", "admin"):
        created = world.client.post(
            f"{API}/environments", json={"name": f"d-{who}", "source": "wheel\n"}, headers=world.as_(who)
        )
        assert created.status_code == 201, created.text
        with world.session_factory() as db:
            job = db.get(Job, created.json()["build_job_id"])
            assert job is not None
            domains[who] = (job.spec.env.get(CACHE_DOMAIN_ENV), job.user_id)
    assert domains["alice"] == (f"user-{domains['alice'][1]}", domains["alice"][1])
    assert domains["admin"][0] == "shared"
