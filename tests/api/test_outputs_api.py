"""A job's outputs over the API (in-process app, SQLite and PostgreSQL): listing and downloading
files whatever their names (docs/storage.md, "Code in, results out")."""

from __future__ import annotations

import time
from typing import Any, cast
from urllib.parse import quote

import pytest

from corral.db.models import Group, Job, User
from corral.spec import JobSpecV1
from corral.storage.layout import outputs_dir
from tests.api.conftest import World

API = "/api/v1"


def _job_with_outputs(world: World, files: dict[str, bytes]) -> int:
    spec = JobSpecV1.model_validate({"name": "out", "command": "true", "resources": {"cpus": 1}})
    with world.session_factory() as db:
        uid = db.query(User.id).filter(User.name == "alice").scalar()
        gid = db.query(Group.id).filter(Group.name == "vision").scalar()
        now = time.time()
        job = Job(name="out", user_id=uid, group_id=gid, state="succeeded", spec=spec, submitted_at=now,
                  updated_at=now, finished_at=now)  # fmt: skip
        db.add(job)
        db.commit()
        job_id = job.id
    top = outputs_dir(cast(Any, world.client.app).state.settings.storage_path, job_id)
    for path, data in files.items():
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        (top / path).write_bytes(data)
    return job_id


@pytest.mark.parametrize("name", ["模型.pt", "ckpt/résumé step 1.bin", 'say "hi".txt', "naïve;x=1.txt"])
def test_an_output_file_with_any_name_downloads(world: World, name: str) -> None:
    job_id = _job_with_outputs(world, {name: b"weights"})
    alice = world.as_("alice")
    listed = world.client.get(f"{API}/jobs/{job_id}/outputs", headers=alice).json()["items"]
    assert [item["path"] for item in listed] == [name]
    r = world.client.get(f"{API}/jobs/{job_id}/outputs/file", params={"path": name}, headers=alice)
    assert r.status_code == 200 and r.content == b"weights", r.text
    disposition = r.headers.get_list("content-disposition")[0]
    assert disposition.startswith('attachment; filename="') and disposition.isascii(), disposition
    assert disposition.endswith(f"filename*=UTF-8''{quote(name.rsplit('/', 1)[-1], safe='')}"), disposition


def test_an_output_whose_name_is_not_utf8_does_not_break_the_listing(world: World) -> None:
    job_id = _job_with_outputs(world, {"ok.bin": b"1"})
    top = outputs_dir(cast(Any, world.client.app).state.settings.storage_path, job_id)
    with open(bytes(top) + b"/bad-\xff.bin", "wb") as f:  # a job may name its files anything
        f.write(b"2")
    r = world.client.get(f"{API}/jobs/{job_id}/outputs", headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    assert [item["path"] for item in r.json()["items"]] == ["ok.bin"]


def test_a_bad_output_path_is_named_as_an_output_path(world: World) -> None:
    # `corral job outputs`/SDK download_output(13, "../x") answered "code path '../x': ...": the
    # check shared with code snapshots named the wrong thing.
    job_id = _job_with_outputs(world, {"ok.bin": b"1"})
    r = world.client.get(
        f"{API}/jobs/{job_id}/outputs/file", params={"path": "../x"}, headers=world.as_("alice")
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["msg"].startswith("output path '../x': no empty"), r.text
