"""The SDK's copies of a job, `Client.submit_from_job` and `Client.retry` (what `corral submit
--from-job` and `corral retry` call), against a real uvicorn server: the new job carries the
source's spec, and each refusal raises the SDK's error with the server's message (its own for a
job that has not ended), submitting nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.config import Settings
from corral.db.models import Job
from corral.sdk import ApiError, Client, CorralError
from corral.storage.layout import ensure_layout
from tests.api.conftest import World
from tests.api.helpers import add_node, make_running
from tests.api.test_cli import server_url

__all__ = ["server_url"]  # the fixture
SPEC = {"name": "again", "command": "echo hi", "retries": 2, "resources": {"memory": "256MiB"}}


@pytest.fixture
def alice(world: World, server_url: str) -> Iterator[Client]:
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    with Client(server_url, world.as_("alice")["Authorization"].split()[1]) as client:
        yield client


def _ended(world: World, job_id: int, state: str) -> None:
    """Leave the job in `state`, as the loops end one."""
    with world.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        job.state = state
        db.commit()


def _job_ids(client: Client) -> list[int]:
    return sorted(j["id"] for j in client.jobs()["items"])


def test_retry_submits_a_copy_of_an_ended_job(world: World, alice: Client) -> None:
    first = alice.submit(SPEC)
    _ended(world, first["id"], "failed")
    copy = alice.retry(first["id"])
    assert copy["id"] != first["id"] and copy["state"] == "queued" and copy["hold"] is None
    assert copy["spec"] == first["spec"] and copy["group"] == "vision"
    held = alice.retry(first["id"], hold=True)
    assert held["hold"]["by"] == "alice" and held["spec"] == first["spec"]
    _ended(world, copy["id"], "succeeded")  # any ended state: a succeeded job is run again too
    assert alice.retry(copy["id"])["spec"] == first["spec"]
    assert len(_job_ids(alice)) == 4


def test_retry_refuses_a_job_that_has_not_ended_naming_its_state(world: World, alice: Client) -> None:
    job = alice.submit(SPEC)
    with pytest.raises(CorralError) as queued:
        alice.retry(job["id"])
    assert str(queued.value) == (
        f"job {job['id']} is queued, not ended: only a succeeded, failed or cancelled job is "
        f"retried (cancel it first to start it over: `corral cancel {job['id']}`)"
    )
    with world.session_factory() as db:
        make_running(db, job["id"])
        db.commit()
    with pytest.raises(CorralError, match=rf"^job {job['id']} is running, not ended: "):
        alice.retry(job["id"])
    assert _job_ids(alice) == [job["id"]]


@pytest.mark.parametrize("copy", ["retry", "submit_from_job"])
def test_an_unknown_or_unseen_job_is_refused_with_the_servers_message(
    world: World, server_url: str, alice: Client, copy: str
) -> None:
    job = alice.submit(SPEC)
    _ended(world, job["id"], "cancelled")
    with pytest.raises(ApiError) as unknown:
        getattr(alice, copy)(job["id"] + 100)
    assert (unknown.value.status_code, str(unknown.value)) == (404, f"no job with id {job['id'] + 100}")
    with Client(server_url, world.as_("carol")["Authorization"].split()[1]) as carol:
        with pytest.raises(ApiError) as unseen:
            getattr(carol, copy)(job["id"])
        # another's job answers exactly as a missing one (ids are not probeable)
        assert (unseen.value.status_code, str(unseen.value)) == (404, f"no job with id {job['id']}")
        assert carol.jobs()["total"] == 0
    assert _job_ids(alice) == [job["id"]]


def test_submit_from_job_copies_a_job_in_any_state(world: World, alice: Client) -> None:
    """A clone, not a retry: a queued or running job is copied too (`corral submit --from-job`)."""
    first = alice.submit(SPEC)
    queued_copy = alice.submit_from_job(first["id"])
    with world.session_factory() as db:
        make_running(db, first["id"])
        db.commit()
    running_copy = alice.submit_from_job(first["id"], hold=True)
    for copy in (queued_copy, running_copy):
        assert copy["id"] != first["id"] and copy["spec"] == first["spec"] and copy["state"] == "queued"
    assert queued_copy["hold"] is None and running_copy["hold"]["by"] == "alice"
    assert alice.job(first["id"])["state"] == "running"  # the source is left as it was


def test_submit_from_job_runs_the_copy_in_new_code(
    world: World, settings: Settings, alice: Client, tmp_path: Path
) -> None:
    """`code` replaces the source's code snapshot (`corral submit --from-job 4 --code .`); the
    rest of the spec is the source's."""
    ensure_layout(Path(settings.storage_path), settings.engine)  # what the server does at start
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('v1')\n")
    v1 = alice.upload_code(tmp_path / "src").id
    first = alice.submit(SPEC, code=v1)
    (tmp_path / "src" / "train.py").write_text("print('v2')\n")
    v2 = alice.upload_code(tmp_path / "src").id
    assert v2 != v1
    same = alice.submit_from_job(first["id"])
    moved = alice.submit_from_job(first["id"], code=v2)
    assert _code_of(first) == _code_of(same) == v1 and _code_of(moved) == v2
    without_code = {k: v for k, v in moved["spec"].items() if k != "code"}
    assert without_code == {k: v for k, v in first["spec"].items() if k != "code"}


def _code_of(job: dict[str, Any]) -> Any:
    return job["spec"].get("code")
