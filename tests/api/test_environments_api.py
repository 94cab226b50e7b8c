"""`POST /environments` refused up front (409 naming why, nothing registered) when a build could
not run here: the configured interpreter is missing, or the build job (a CPU job) fits no node,
e.g. a Slurm cluster of GPU nodes only with CPU jobs kept off them (CORRAL_CPU_JOBS_ON_GPU_NODES)."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import World
from tests.api.helpers import add_node

API = "/api/v1"


def _settings(w: World) -> Any:
    settings = w.client.app.state.settings  # type: ignore[attr-defined]
    settings.env_find_links = settings.home / "wheels"  # builds need a package source
    return settings


def _nothing_registered(w: World) -> None:
    listed = w.client.get(f"{API}/environments", headers=w.as_("alice"))
    assert listed.status_code == 200 and listed.json() == [], listed.text
    jobs = w.client.get(f"{API}/jobs", headers=w.as_("alice")).json()["items"]
    assert jobs == [], jobs


def test_a_missing_interpreter_is_refused_by_name(world: World) -> None:
    _settings(world).env_python = "/nonexistent/bin/python3"
    r = world.client.post(
        f"{API}/environments", json={"name": "tpkg", "source": "numpy\n"}, headers=world.as_("alice")
    )
    assert r.status_code == 409, r.text
    assert "interpreter /nonexistent/bin/python3 is not there" in r.json()["detail"], r.text
    _nothing_registered(world)


def test_a_build_job_that_fits_no_node_is_refused(world: World) -> None:
    settings = _settings(world)
    settings.cpu_jobs_on_gpu_nodes = False  # Slurm's default: GPU nodes keep to GPU work
    with world.session_factory() as db:
        add_node(db, "gpu1", gpus=2)
        db.commit()
    r = world.client.post(
        f"{API}/environments", json={"name": "tpkg", "source": "numpy\n"}, headers=world.as_("alice")
    )
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert "their build job (1 CPU, 2 GiB, no GPU) fits no node" in detail, detail
    _nothing_registered(world)
