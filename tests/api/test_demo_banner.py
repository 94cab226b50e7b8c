"""The demo's banner says what is true of the example job: restarted on a home whose example had
already run, it said "digits-demo trains an MLP on CPU in environment sklearn once it is built"."""

from __future__ import annotations

import time

import pytest

from corral.db.models import Job
from corral.server.demo import example_line
from corral.server.finish import end_attempt
from corral.services.lifecycle import AttemptState, JobState, transition
from tests.api.conftest import World
from tests.api.helpers import add_node, make_running


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_the_example_line_follows_the_example_job(world: World) -> None:
    with world.session_factory() as db:
        assert example_line(db, None) == (
            "digits-demo trains an MLP on CPU in environment sklearn once it is built; `corral ls`"
        )
        assert example_line(db, True).endswith("in environment sklearn starting now; `corral ls`")
        assert example_line(db, False) == (
            "digits-demo not started: environment sklearn failed to build; `corral env show sklearn`"
        )
        add_node(db, "n1")
        db.commit()
    spec = {"name": "digits-demo", "command": "python digits.py", "resources": {"memory": "256MiB"}}
    made = world.client.post("/api/v1/jobs", json=spec, headers=world.as_("alice"))
    assert made.status_code == 201, made.text
    number = made.json()["id"]
    with world.session_factory() as db:
        line = example_line(db, True)
        assert line == (
            f"job {number} (digits-demo) queued: it trains an MLP on CPU in environment sklearn;"
            f" `corral logs {number}`"
        ), line
        attempt = make_running(db, number)
        db.expire_all()
        job = db.get(Job, number)
        assert job is not None
        now = time.time()
        assert transition(db, job, JobState.SUCCEEDED, now=now)  # as the loops settle an exit 0
        end_attempt(db, job, attempt, AttemptState.SUCCEEDED, now, exit_code=0)
        db.commit()
    with world.session_factory() as db:  # what a restart on this home prints, the build long done
        line = example_line(db, True)
    assert line == f"job {number} (digits-demo) succeeded; `corral show {number}`, `corral logs {number}`", (
        line
    )
