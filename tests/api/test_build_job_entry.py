"""An environment's build job is closed to its submitter (review104, finding 4): `corral exec`, a
port forward and SSH (`alice+job-N`) into it are refused with 403 naming it a build job, for its
owner and for an admin alike (a shell in it had the package index's outbound network, around
CORRAL_JOB_OUTBOUND, and could edit the venv that goes into the shared store: finding 2), and it
gets neither the user's home nor their group dirs, whose files (a `.pth` in ~/.local, a uv cache)
would run in it or feed its venv."""

from __future__ import annotations

from typing import Any

import pytest

from corral.db.environment_models import EnvironmentVersion
from corral.db.models import Job
from corral.gateway import resolver
from corral.services.errors import Forbidden
from corral.storage.plan import plan_jobs
from tests.api.conftest import World
from tests.api.helpers import add_node, make_running
from tests.server.fakes import FakeEngine

API = "/api/v1"


def _running_build_job(w: World) -> int:
    settings = w.client.app.state.settings  # type: ignore[attr-defined]
    settings.env_find_links = settings.home / "wheels"  # builds need a package source
    with w.session_factory() as db:
        add_node(db)
        db.commit()
    created = w.client.post(
        f"{API}/environments", json={"name": "tpkg", "source": "numpy\n"}, headers=w.as_("alice")
    )
    assert created.status_code == 201, created.text
    job_id = int(created.json()["build_job_id"])
    with w.session_factory() as db:
        make_running(db, job_id, gpu_indices=())
    return job_id


def _entry_answer(w: World, who: str, job_id: int, request: dict[str, Any]) -> dict[str, Any]:
    w.client.app.state.engine = FakeEngine()  # type: ignore[attr-defined]  # exec needs one
    with w.client.websocket_connect(f"{API}/jobs/{job_id}/exec", headers=w.as_(who)) as ws:
        ws.send_json(request)
        answer: dict[str, Any] = ws.receive_json()
    return answer


@pytest.mark.parametrize(
    ("who", "request_"),
    [
        ("alice", {"argv": ["sh", "-c", "echo edited >> /outputs/venv/x"]}),
        ("alice", {"port": 8080}),
        ("admin", {"argv": ["id"]}),
    ],
)
def test_exec_and_port_forward_into_a_build_job_are_refused(
    world: World, who: str, request_: dict[str, Any]
) -> None:
    job_id = _running_build_job(world)
    answer = _entry_answer(world, who, job_id, request_)
    assert answer["status"] == 403, answer
    assert f"job {job_id} is an environment's build job: nobody may enter it" in answer["error"], answer
    for action in ("job.exec", "job.port_forward"):  # no entry was recorded
        audit = world.client.get(f"{API}/audit?action={action}", headers=world.as_("admin"))
        assert audit.status_code == 200 and audit.json()["items"] == [], audit.text


def test_ssh_into_a_build_job_is_refused_and_an_ordinary_job_is_not(world: World) -> None:
    job_id = _running_build_job(world)
    with world.session_factory() as db:
        alice = resolver.principal_for(db, "alice", "127.0.0.1")
        with pytest.raises(Forbidden) as refused:
            resolver.resolve(db, alice, resolver.parse_login(f"alice+job-{job_id}"))
    assert f"job {job_id} is an environment's build job" in refused.value.message
    assert refused.value.status_code == 403

    plain = world.client.post(
        f"{API}/jobs", json={"name": "plain", "command": "sleep 60"}, headers=world.as_("alice")
    )
    assert plain.status_code == 201, plain.text
    plain_id = int(plain.json()["id"])
    with world.session_factory() as db:
        make_running(db, plain_id, gpu_indices=())
        target = resolver.resolve(db, alice, resolver.parse_login(f"alice+job-{plain_id}"))
    assert (target.job_id, target.owner, target.rank) == (plain_id, "alice", 0)


def test_a_build_job_gets_no_home_nor_group_dirs(world: World) -> None:
    build_id = _running_build_job(world)
    plain = world.client.post(
        f"{API}/jobs", json={"name": "plain", "command": "true"}, headers=world.as_("alice")
    )
    assert plain.status_code == 201, plain.text
    plain_id = int(plain.json()["id"])
    settings = world.client.app.state.settings  # type: ignore[attr-defined]
    with world.session_factory() as db:
        interpreter = db.query(EnvironmentVersion.interpreter).filter_by(build_job_id=build_id).scalar()
        jobs = [db.get(Job, build_id), db.get(Job, plain_id)]
        assert all(job is not None for job in jobs)
        plans = plan_jobs(db, jobs, settings, {build_id: interpreter})  # type: ignore[arg-type]
        build_spec = jobs[0].spec  # type: ignore[union-attr]
    build, ordinary = plans[build_id], plans[plain_id]
    assert not build.refused and not ordinary.refused, (build.refused, ordinary.refused)
    assert {"home", "group/vision"} <= {b.source for b in ordinary.binds}  # the control
    sources = {b.source for b in build.binds}
    assert "home" not in sources and not any(s.startswith("group/") for s in sources), sources
    assert {"outputs", "env/tools", "env/store"} <= sources, sources
    assert build.home is None
    assert '"$CORRAL_ENV_PYTHON" -I ' in build_spec.tasks["main"].command  # no user site, no PYTHON*
