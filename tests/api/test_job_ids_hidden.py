"""A job the caller may not see answers every route exactly as a job id no row has (404 "no job
with id N"), so no answer tells which ids are live (services.jobs.get_job). Those who may see a
job (its owner, the admins of its group, platform admins) see it as before, and a group admin
refused an action on a member's job still gets a 403 naming why."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.api.conftest import SIMPLE_JOB, World

API = "/api/v1"
MISSING = 999_999
TEMPLATE_SPEC = {"name": "t", "command": "echo hi", "resources": {"cpus": 1, "memory": "256MiB"}}

Call = Callable[[World, int], httpx.Response]
CALLS: dict[str, Call] = {
    "GET /jobs/{id}": lambda w, j: w.client.get(f"{API}/jobs/{j}", headers=w.as_("carol")),
    "GET /jobs/{id}/events": lambda w, j: w.client.get(f"{API}/jobs/{j}/events", headers=w.as_("carol")),
    "GET /jobs/{id}/logs": lambda w, j: w.client.get(f"{API}/jobs/{j}/logs", headers=w.as_("carol")),
    "GET /jobs/{id}/outputs": lambda w, j: w.client.get(f"{API}/jobs/{j}/outputs", headers=w.as_("carol")),
    "GET /jobs/{id}/outputs/file": lambda w, j: w.client.get(
        f"{API}/jobs/{j}/outputs/file", params={"path": "x"}, headers=w.as_("carol")
    ),
    "POST /jobs/{id}/hold": lambda w, j: w.client.post(f"{API}/jobs/{j}/hold", headers=w.as_("carol")),
    "POST /jobs/{id}/release": lambda w, j: w.client.post(f"{API}/jobs/{j}/release", headers=w.as_("carol")),
    "POST /jobs/{id}/cancel": lambda w, j: w.client.post(f"{API}/jobs/{j}/cancel", headers=w.as_("carol")),
    "DELETE /jobs/{id}": lambda w, j: w.client.delete(f"{API}/jobs/{j}", headers=w.as_("carol")),
    "POST /templates (from_job)": lambda w, j: w.client.post(
        f"{API}/templates", json={"name": "copied", "from_job": j}, headers=w.as_("carol")
    ),
    "POST /models/{name}/versions (job_id)": lambda w, j: w.client.post(
        f"{API}/models/digits/versions", json={"job_id": j}, headers=w.as_("carol")
    ),
}


def _alices_job(w: World) -> int:
    r = w.client.post(f"{API}/jobs", json={**SIMPLE_JOB, "group": "vision"}, headers=w.as_("alice"))
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


@pytest.mark.parametrize("route", list(CALLS))
def test_another_users_job_answers_as_a_missing_one(world: World, route: str) -> None:
    """carol (nlp) gets the same status and body for alice's vision job as for an id no job has."""
    job_id = _alices_job(world)
    answers = []
    for probe in (job_id, MISSING):
        r = CALLS[route](world, probe)
        answers.append((r.status_code, r.json()["detail"].replace(str(probe), "N")))
    assert answers[0] == answers[1] == (404, "no job with id N"), answers
    r = world.client.get(f"{API}/jobs/{job_id}", headers=world.as_("alice"))
    assert r.status_code == 200 and r.json()["state"] == "queued", r.text  # nothing was done to it


def test_those_who_may_see_a_job_still_see_it_and_are_told_why_they_are_refused(world: World) -> None:
    job_id = _alices_job(world)
    for who in ("alice", "bob", "admin"):  # owner, vision's group admin, platform admin
        r = world.client.get(f"{API}/jobs/{job_id}", headers=world.as_(who))
        assert r.status_code == 200 and r.json()["id"] == job_id, (who, r.text)
    r = world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("bob"))  # sees it, may not delete
    assert r.status_code == 403 and "only the owner" in r.json()["detail"], r.text


def test_an_unseen_job_is_neither_read_nor_locked(world: World) -> None:
    """get_job asks the database only for jobs the caller may see (review105): hold, release,
    cancel and delete lock the job's row, and a row of another user's job read and locked before
    the 404 let anyone hold other users' rows (and time the difference to a missing id). On
    PostgreSQL a second transaction can still take alice's row at once while carol's is open."""
    from sqlalchemy import select

    from corral.db.models import Job
    from corral.gateway import resolver
    from corral.services.errors import NotFound
    from corral.services.jobs import get_job

    job_id = _alices_job(world)
    with world.session_factory() as first, world.session_factory() as second:
        carol = resolver.principal_for(first, "carol", "127.0.0.1")
        with pytest.raises(NotFound, match=f"no job with id {job_id}"):
            get_job(first, carol, job_id, for_update=True)
        if second.get_bind().dialect.name == "postgresql":
            stmt = select(Job.id).where(Job.id == job_id).with_for_update(nowait=True)
            assert second.scalar(stmt) == job_id  # NOWAIT: it would raise were the row locked
        alice = resolver.principal_for(second, "alice", "127.0.0.1")
        assert get_job(second, alice, job_id).id == job_id
