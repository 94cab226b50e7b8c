"""Job endpoints a new user reaches for: logs of a job that waits (why it waits, not nothing)."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from corral.db.models import Job
from corral.engine.base import AttemptLaunch
from corral.engine.local import LocalEngine
from corral.services import cleanup
from tests.api.conftest import SIMPLE_JOB, World
from tests.api.helpers import add_node, make_running

API = "/api/v1"


def submit(world: World, user: str = "alice", spec: dict[str, object] | None = None) -> int:
    r = world.client.post(f"{API}/jobs", json=spec or SIMPLE_JOB, headers=world.as_(user))
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_logs_of_a_queued_job_say_why_it_waits(world: World) -> None:
    """Found by trying it: `corral logs` on a queued job printed nothing at all (and without an
    engine the API answered 503, though a job with no attempt has no logs to read)."""
    job_id = submit(world)
    r = world.client.get(f"{API}/jobs/{job_id}/logs", headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["data"] == "" and body["attempt"] is None and body["eof"] is False
    assert body["waiting"]["state"] == "queued"
    assert "the scheduler has not looked at it yet" in body["waiting"]["message"]
    estimate = time.time() + 600
    with world.session_factory() as db:  # the diagnosis as the schedule loop writes it
        job = db.get(Job, job_id)
        assert job is not None
        job.diagnosis = {
            "reasons": [
                {"code": "quota", "source": "admission", "message": "group vision is at its GPU quota"}
            ],
            "queue_position": 3,
            "estimated_start": estimate,
            "unschedulable": False,
        }
        db.commit()
    waiting = world.client.get(f"{API}/jobs/{job_id}/logs", headers=world.as_("bob")).json()["waiting"]
    assert waiting["queue_position"] == 3 and waiting["estimated_start"] == estimate
    assert waiting["reasons"][0]["code"] == "quota"
    message = waiting["message"]
    assert message.startswith(f"job {job_id} is queued: group vision is at its GPU quota")
    assert "position 3 in the queue" in message and "estimated start in" in message


def test_logs_of_a_started_job_still_need_the_engine(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    job_id = submit(world)
    with world.session_factory() as db:
        make_running(db, job_id)
    r = world.client.get(f"{API}/jobs/{job_id}/logs", headers=world.as_("alice"))
    assert r.status_code == 503 and "no execution engine" in r.json()["detail"]


def test_delete_a_finished_job_by_its_owner_or_an_admin(world: World) -> None:
    job_id = submit(world)
    r = world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("alice"))
    assert r.status_code == 409 and "only finished jobs can be deleted" in r.json()["detail"]
    assert f"corral cancel {job_id}" in r.json()["detail"]
    assert world.client.post(f"{API}/jobs/{job_id}/cancel", headers=world.as_("alice")).status_code == 200
    r = world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("carol"))  # may not see it
    assert (r.status_code, r.json()["detail"]) == (404, f"no job with id {job_id}")  # as a missing job
    r = world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("bob"))  # sees it (group admin)
    assert r.status_code == 403 and "only the owner" in r.json()["detail"]
    assert world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("alice")).status_code == 204
    assert world.client.get(f"{API}/jobs/{job_id}", headers=world.as_("alice")).status_code == 404
    assert world.client.get(f"{API}/jobs/{job_id}/events", headers=world.as_("admin")).status_code == 404
    assert world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("alice")).status_code == 404
    other = submit(world)
    world.client.post(f"{API}/jobs/{other}/cancel", headers=world.as_("alice"))
    assert world.client.delete(f"{API}/jobs/{other}", headers=world.as_("admin")).status_code == 204
    listing = world.client.get(f"{API}/jobs", headers=world.as_("admin")).json()
    assert listing["total"] == 0


def test_a_deleted_jobs_id_is_never_given_again(world: World) -> None:
    # SQLite handed out max(rowid)+1: the newest jobs deleted (`corral rm 2 3`), the next submits
    # became jobs 2 and 3 again, and lineage, audit, engine attempt dirs named the new ones.
    ids = [submit(world) for _ in range(3)]
    for job_id in ids[1:]:
        assert world.client.post(f"{API}/jobs/{job_id}/cancel", headers=world.as_("alice")).status_code == 200
        assert world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("alice")).status_code == 204
    after = [submit(world) for _ in range(2)]
    assert min(after) > max(ids), f"earlier jobs {ids}, then {after}"
    assert len(set(after)) == 2


def test_a_deleted_jobs_kept_attempt_dir_is_not_the_next_jobs(world: World, tmp_path: Path) -> None:
    # The local engine names an attempt's dir "<job id>.<number>" and launches idempotently per
    # name. Deleting a job keeps the dir of an attempt the engine has not finished (no status.json
    # yet: a supervisor still stopping), and the sweep leaves an attempt with no row alone; when
    # SQLite gave the deleted job's id again, the new job's launch of "<id>.1" found that dir and
    # answered the old process's ref: the new job never ran and reported the old one's end.
    engine = LocalEngine(tmp_path / "home", "n1", virtual_gpus=2, isolation=False, allow_unisolated=True)
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    ids = [submit(world) for _ in range(3)]
    with world.session_factory() as db:
        make_running(db, ids[-1])
        job = db.scalars(select(Job).where(Job.id == ids[-1]).options(selectinload(Job.attempts))).one()
        job.state, job.finished_at = "failed", time.time()
        job.attempts[0].state = "lost"
        stale = engine.attempts_dir / job.attempts[0].attempt_id
        stale.mkdir()
        (stale / "engine_ref").write_text("4242")  # launched; its end not written yet
        db.commit()
        cleanup.remove_job(db, job, engine)
        db.commit()
    assert stale.exists()  # kept: not finished, so not the engine's to remove yet
    new = submit(world)
    ref = engine.launch(
        AttemptLaunch(f"{new}.1", str(new), 1, "alice", "vision", instances=(), refused="test: not run")
    )
    assert ref == "refused", f"job {new}'s first launch answered {ref!r}: the deleted job {ids[-1]}'s"
    engine.close()


def test_delete_keeps_a_job_whose_logs_cannot_be_deleted(world: World) -> None:
    """Without an engine the logs cannot go, so the job stays (nothing half-done)."""
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    job_id = submit(world)
    with world.session_factory() as db:
        make_running(db, job_id)
        job = db.get(Job, job_id)
        assert job is not None
        job.state, job.finished_at = "succeeded", time.time()
        db.commit()
    r = world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("alice"))
    assert r.status_code == 503 and "no execution engine" in r.json()["detail"]
    assert world.client.get(f"{API}/jobs/{job_id}", headers=world.as_("alice")).status_code == 200
