"""The typed JSON columns: `Job.spec`, `Job.diagnosis` and `Attempt.placement` come back from a
row as `JobSpecV1`, `JobDiagnosis` and `InstancePlacement`s, on SQLite and on PostgreSQL; the JSON
stored is the shape the API returned before they were typed; a stored spec is parsed once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import StatementError
from sqlalchemy.orm import Session, sessionmaker

from corral.db.models import Attempt, Group, Job, User
from corral.db.session import init_db, make_engine, make_session_factory
from corral.domain import InstancePlacement, JobDiagnosis, PendingReason
from corral.spec import JobSpecV1
from tests.pg import PostgresServer

SPEC = {
    "name": "two-roles",
    "tasks": {
        "worker": {"instances": 2, "command": "w", "resources": {"gpus": 1, "memory": "2GiB"}},
        "chief": {"command": "c"},
    },
    "stop_grace": "30s",
}
PLACED = InstancePlacement(
    role="worker",
    index=1,
    rank=1,
    node="n1",
    gpu_indices=(3,),
    gpu_uuids=("GPU-n1-3",),
    cpus=2.0,
    memory_mib=2048,
)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'corral.db'}"
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = server.create_database()
    engine = make_engine(url)
    init_db(url, engine=engine)
    yield make_session_factory(engine)
    engine.dispose()


def add_job(db: Session, spec: object) -> int:
    now = time.time()
    user, group = User(name="u", created_at=now), Group(name="g", created_at=now)
    db.add_all([user, group])
    db.flush()
    job = Job(
        name="j",
        user_id=user.id,
        group_id=group.id,
        state="queued",
        spec=spec,
        submitted_at=now,
        updated_at=now,
    )
    db.add(job)
    db.commit()
    return job.id


def raw(db: Session, sql: str) -> object:
    value = db.execute(sa.text(sql)).scalar_one()
    return json.loads(value) if isinstance(value, str) else value


def test_columns_round_trip_as_typed_models_in_the_stored_json_shape(factory: sessionmaker[Session]) -> None:
    spec = JobSpecV1.model_validate(SPEC)
    diagnosis = JobDiagnosis((PendingReason("quota_exhausted", "quota", "wait"),), 2, None)
    with factory() as db:
        job_id = add_job(db, spec)
        db.add(
            Attempt(job_id=job_id, number=1, state="scheduled", placement=(PLACED,), created_at=time.time())
        )
        db.get_one(Job, job_id).diagnosis = diagnosis
        db.commit()
    with factory() as db:
        job = db.get_one(Job, job_id)
        assert isinstance(job.spec, JobSpecV1) and [t.role for t in job.spec.view.tasks] == [
            "worker",
            "chief",
        ]
        assert job.spec == spec and job.diagnosis == diagnosis
        assert job.attempts[0].placement == (PLACED,)
        # The JSON in the table is what the API stored and returned before the columns were typed.
        assert raw(db, "SELECT spec FROM jobs") == spec.model_dump(mode="json", exclude_none=True)
        assert raw(db, "SELECT placement FROM attempts") == [
            {
                "role": "worker",
                "index": 1,
                "rank": 1,
                "node": "n1",
                "gpu_indices": [3],
                "gpu_uuids": ["GPU-n1-3"],
                "cpus": 2.0,
                "memory_mib": 2048,
            }
        ]
        assert raw(db, "SELECT diagnosis FROM jobs") == {
            "reasons": [{"code": "quota_exhausted", "source": "quota", "message": "wait"}],
            "queue_position": 2,
            "estimated_start": None,
            "unschedulable": False,
            "start_range": None,
            "held": True,  # quota_exhausted: no time, by design (domain.HELD_CODES)
        }


def test_a_stored_spec_is_parsed_once_and_shared(factory: sessionmaker[Session]) -> None:
    with factory() as db:
        first, second = add_job(db, JobSpecV1.model_validate(SPEC)), None
        job = Job(name="k", user_id=1, group_id=1, state="queued", spec=JobSpecV1.model_validate(SPEC))
        job.submitted_at = job.updated_at = time.time()
        db.add(job)
        db.commit()
        second = job.id
    with factory() as db:
        a, b = db.get_one(Job, first).spec, db.get_one(Job, second).spec
        assert a is b and a.view is b.view  # one instance per stored text, its view computed once
        with pytest.raises(Exception, match="frozen"):
            a.name = "changed"  # type: ignore[misc]


def test_the_stored_shape_is_validated_before_it_is_written(factory: sessionmaker[Session]) -> None:
    with factory() as db, pytest.raises(StatementError, match="tasks"):
        add_job(db, {"name": "no-tasks"})  # a fixture or older code writing a dict: refused
    with factory() as db:
        job_id = add_job(db, dict(SPEC))  # the same as a dict is accepted, through the model
        bad = Attempt(job_id=job_id, number=1, state="scheduled", placement=[{"node": "n1"}], created_at=0.0)
        db.add(bad)
        with pytest.raises(StatementError, match="rank"):
            db.commit()
