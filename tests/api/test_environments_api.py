"""`POST /environments` refused up front (409 naming why, nothing registered) when a build could
not run here: the configured interpreter is missing, or the build job (a CPU job) fits no node,
e.g. a Slurm cluster of GPU nodes only with CPU jobs kept off them (CORRAL_CPU_JOBS_ON_GPU_NODES)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from corral.db.environment_models import Environment, EnvironmentVersion
from corral.db.models import Group, Job, User
from corral.spec import JobSpecV1
from tests.api.conftest import World
from tests.api.helpers import add_node
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]

API = "/api/v1"


def _settings(w: World) -> Any:
    settings = w.client.app.state.settings  # type: ignore[attr-defined]
    settings.env_find_links = settings.home / "wheels"  # builds need a package source
    return settings


def _create_tpkg(w: World) -> httpx.Response:
    """alice asks for environment tpkg (numpy): its answer (201 with its build job, or refused)."""
    return w.client.post(
        f"{API}/environments", json={"name": "tpkg", "source": "numpy\n"}, headers=w.as_("alice")
    )


def _tpkg_building_on_a_cpu_node(w: World) -> int:
    """tpkg created with a CPU node to build on: its build job's id."""
    _settings(w)
    with w.session_factory() as db:
        add_node(db, "cpu1", gpus=0)
        db.commit()
    made = _create_tpkg(w)
    assert made.status_code == 201, made.text
    return int(made.json()["build_job_id"])


def _nothing_registered(w: World) -> None:
    listed = w.client.get(f"{API}/environments", headers=w.as_("alice"))
    assert listed.status_code == 200 and listed.json() == [], listed.text
    jobs = w.client.get(f"{API}/jobs", headers=w.as_("alice")).json()["items"]
    assert jobs == [], jobs


def test_a_missing_interpreter_is_refused_by_name(world: World) -> None:
    _settings(world).env_python = "/nonexistent/bin/python3"
    r = _create_tpkg(world)
    assert r.status_code == 409, r.text
    assert "interpreter /nonexistent/bin/python3 is not there" in r.json()["detail"], r.text
    _nothing_registered(world)


def test_a_build_job_that_fits_no_node_is_refused(world: World) -> None:
    settings = _settings(world)
    settings.cpu_jobs_on_gpu_nodes = False  # Slurm's default: GPU nodes keep to GPU work
    with world.session_factory() as db:
        add_node(db, "gpu1", gpus=2)
        db.commit()
    r = _create_tpkg(world)
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert "their build job (1 CPU, 2 GiB, no GPU) fits no node" in detail, detail
    _nothing_registered(world)


def test_deleting_a_version_a_job_mounts_through_env_is_refused(world: World) -> None:
    """A spec's `mounts: [{source: env/tools}]` is pinned to `env/tools@1` at submit; deleting
    tools@1 (or tools) while that job had not ended was allowed (204): only `environment:` was
    looked at, so the version's store copy went to gc under the running job."""
    now = time.time()
    with world.session_factory() as db:
        alice = db.query(User).filter(User.name == "alice").one()
        vision = db.query(Group).filter(Group.name == "vision").one()
        env = Environment(
            name="tools", owner_id=alice.id, visibility="private", created_at=now, last_version=1
        )
        db.add(env)
        db.flush()
        db.add(EnvironmentVersion(
            environment_id=env.id, version=1, state="ready", source_kind="requirements", source="numpy\n",
            python="3.11.7", created_by="alice", created_at=now,
        ))  # fmt: skip
        spec = JobSpecV1.model_validate(
            {"name": "mounts-env", "command": "true", "mounts": [{"source": "env/tools@1"}]}
        )
        job = Job(name="mounts-env", user_id=alice.id, group_id=vision.id, state="running", spec=spec,
                  submitted_at=now, updated_at=now)  # fmt: skip
        db.add(job)
        db.commit()
        job_id = job.id
    for path, named in ((f"{API}/environments/tools?version=1", "version 'tools@1'"),
                        (f"{API}/environments/tools", "'tools'")):  # fmt: skip
        r = world.client.delete(path, headers=world.as_("alice"))
        assert r.status_code == 409, r.text
        assert f"in use by active job {job_id}" in r.json()["detail"], r.text
        assert r.json()["detail"].startswith(f"environment {named} is"), r.text  # the version asked for


def test_a_build_job_is_kept_until_its_version_is_settled(world: World) -> None:
    """`corral rm` of a build job that had ended before the env-builds loop settled its version
    went through (204): the version then waited to fail as orphaned, or, with the job's id given
    again to the next job (SQLite), was settled from that other job's outputs."""
    now = time.time()
    with world.session_factory() as db:
        alice = db.query(User).filter(User.name == "alice").one()
        vision = db.query(Group).filter(Group.name == "vision").one()
        spec = JobSpecV1.model_validate({"name": "env-build-tools-v1", "command": "true"})
        job = Job(name="env-build-tools-v1", user_id=alice.id, group_id=vision.id, state="succeeded",
                  spec=spec, submitted_at=now, updated_at=now, finished_at=now)  # fmt: skip
        db.add(job)
        env = Environment(
            name="tools", owner_id=alice.id, visibility="private", created_at=now, last_version=1
        )
        db.add(env)
        db.flush()
        version = EnvironmentVersion(
            environment_id=env.id, version=1, state="building", source_kind="requirements", source="numpy\n",
            python="3.11.7", created_by="alice", created_at=now, build_job_id=job.id,
        )  # fmt: skip
        db.add(version)
        db.commit()
        job_id, version_id = job.id, version.id
    r = world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("alice"))
    assert r.status_code == 409, r.text
    assert "it builds environment tools@1, not settled yet" in r.json()["detail"], r.text
    with world.session_factory() as db:  # settled (the loop's write): the job may go
        db.query(EnvironmentVersion).filter(EnvironmentVersion.id == version_id).update({"state": "ready"})
        db.commit()
    r = world.client.delete(f"{API}/jobs/{job_id}", headers=world.as_("alice"))
    assert r.status_code == 204, r.text


def test_a_copy_of_a_build_job_is_refused_at_submit(world: World) -> None:
    """`corral submit --from-job N` of an environment's build job was queued, and then failed in
    the job ("can't open file '/corral/tools/buildstep-....py'"): the build tools are bound only
    into the build job the environments service submits. The copy is refused at submit (422)."""
    build_job = _tpkg_building_on_a_cpu_node(world)
    build = world.client.get(f"{API}/jobs/{build_job}", headers=world.as_("alice")).json()
    copy = world.client.post(f"{API}/jobs", json=build["spec"], headers=world.as_("alice"))
    assert copy.status_code == 422, f"a copy of build job {build['id']} was accepted: {copy.text}"
    assert "a copy of an environment build job" in copy.text, copy.text
    assert copy.json()["detail"][0]["loc"] == ["body", "env", "CORRAL_ENV_TOOLS"]
    jobs = world.client.get(f"{API}/jobs", headers=world.as_("alice")).json()["items"]
    assert [j["id"] for j in jobs] == [build["id"]]


def test_a_template_saved_from_a_build_job_is_refused_at_publish(world: World) -> None:
    """`corral template publish bj --from-job N` of a build job made a template every use of
    which was then refused ("this is a copy of an environment build job"); the publish is
    refused, saying so, with nothing saved."""
    build_job = _tpkg_building_on_a_cpu_node(world)
    r = world.client.post(
        f"{API}/templates", json={"name": "bj", "from_job": build_job}, headers=world.as_("alice")
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "from_job"], r.text
    assert r.json()["detail"][0]["msg"].startswith(
        f"job {build_job} cannot be a template (each job made from it would be refused): this is a copy "
        "of an environment build job"
    ), r.text
    assert world.client.get(f"{API}/templates", headers=world.as_("alice")).json() == []
    # Written as one, not copied (review105): the same refusal, at the spec
    for spec, words in (
        ({"name": "w", "kind": "workspace", "command": "sleep 1"}, "a job of kind 'workspace'"),
        ({"name": "b", "command": "true", "env": {"CORRAL_ENV_TOOLS": "/x"}}, "this is a copy of"),
    ):
        r = world.client.post(
            f"{API}/templates", json={"name": "bj", "spec": spec}, headers=world.as_("alice")
        )
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "spec"], r.text
        assert r.json()["detail"][0]["msg"].startswith(
            f"this spec cannot be a template (each job made from it would be refused): {words}"
        ), r.text
    assert world.client.get(f"{API}/templates", headers=world.as_("alice")).json() == []


def test_env_ls_lists_the_servers_own_default_that_jobs_and_workspaces_accept(
    world: World, server_url: str
) -> None:
    """`corral env ls` never listed `default`, though the demo banner and `ws create --help`
    point to it and submit / ws create take it: the table lists it first, marked as the
    server's; `-o json` stays the catalogue's, as GET /environments answers."""
    with world.session_factory() as db:
        add_node(db)
        db.commit()
    created = world.client.post(
        f"{API}/workspaces", json={"name": "nb", "environment": "default"}, headers=world.as_("alice")
    )
    assert created.status_code == 201 and created.json()["environment"] == "default", created.text
    code, out = run(world, server_url, "alice", "env", "ls")
    assert code == 0, out
    header, first = out.splitlines()[:2]
    assert header.split()[:2] == ["NAME", "READY"], out
    assert first.split() == ["default", "(the", "server's)", "always", "-", "everyone", "-", "-"], out
    code, out = run(world, server_url, "alice", "env", "ls", "-o", "json")
    assert code == 0 and json.loads(out) == [], out


def test_the_servers_own_default_is_named_as_such_where_it_has_no_catalogue_entry(world: World) -> None:
    """`corral env ls` lists `default` first, yet `env show default` answered "there is no
    environment named 'default'" and a job's `environment: default@1` "environment 'default' does
    not exist (see `corral env ls`)", which lists it. Each now says what `default` is."""
    alice = world.as_("alice")
    what = "'default' is the server's own interpreter and packages, not a catalogue environment"
    for method, path in (
        ("GET", f"{API}/environments/default"),
        ("GET", f"{API}/environments/default/versions/1"),
        ("DELETE", f"{API}/environments/default"),
    ):
        r = world.client.request(method, path, headers=alice)
        assert r.status_code == 404 and what in r.json()["detail"], (method, path, r.text)
    spec = {"name": "pinned", "command": "true", "environment": "default@1"}
    r = world.client.post(f"{API}/jobs", json=spec, headers=alice)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["msg"].startswith(f"environment 'default@1': {what}"), r.text
    spec = {"name": "mounted", "command": "true", "mounts": [{"source": "env/default"}]}
    r = world.client.post(f"{API}/jobs", json=spec, headers=alice)
    assert r.status_code == 422 and what in r.text, r.text
