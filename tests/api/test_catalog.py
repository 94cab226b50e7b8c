"""Templates and the model registry through the API (SQLite and PostgreSQL, no engine: a job's
end and its outputs are written the way the loops and the job would write them)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa

from corral.catalog.model_files import PATH_PATTERN
from corral.db.models import Job
from corral.services import cleanup
from corral.storage.layout import outputs_dir
from tests.api.conftest import World
from tests.api.helpers import add_node

API = "/api/v1"
TEMPLATE = """
parameters:
  lr: {type: float, default: 0.01, min: 0, max: 1, description: learning rate}
  gpus: {type: int, default: 1, min: 1, max: 2}
  opt: {type: choice, choices: [sgd, adam], default: adam}
  amp: {type: bool, default: false}
name: train-${opt}
command: python train.py --lr ${lr} --opt ${opt} --amp ${amp}
resources:
  gpus: ${gpus}
  cpus: 1
  memory: 256MiB
"""


def publish(world: World, user: str, name: str, spec: Any, **extra: Any) -> Any:
    return world.client.post(
        f"{API}/templates", json={"name": name, "spec": spec, **extra}, headers=world.as_(user)
    )


def test_template_use_renders_typed_values_and_refuses_bad_ones(world: World) -> None:
    with world.session_factory() as db:
        add_node(db, gpus=2)
        db.commit()
    r = publish(world, "alice", "train", TEMPLATE, group="vision")
    assert r.status_code == 201, r.text
    assert [p["name"] for p in r.json()["parameters"]] == ["lr", "gpus", "opt", "amp"]
    use = world.client.post(
        f"{API}/templates/train/use",
        json={"values": {"lr": "0.5", "gpus": 2, "opt": "sgd"}},
        headers=world.as_("bob"),
    )
    assert use.status_code == 201, use.text
    spec = use.json()["spec"]
    assert spec["name"] == "train-sgd"
    assert spec["tasks"]["main"]["command"] == "python train.py --lr 0.5 --opt sgd --amp false"
    assert spec["tasks"]["main"]["resources"]["gpus"] == 2  # a number, not the text "2"
    bad = {
        "gpus": ({"gpus": 3}, "more than the maximum"),
        "lr": ({"lr": "fast"}, "expected a number"),
        "opt": ({"opt": "rmsprop"}, "not one of sgd, adam"),
        "amp": ({"amp": "maybe"}, "expected true or false"),
        "nosuch": ({"nosuch": 1}, "unknown parameter"),
    }
    for param, (values, why) in bad.items():
        r = world.client.post(
            f"{API}/templates/train/use", json={"values": values}, headers=world.as_("alice")
        )
        assert r.status_code == 422, (param, r.text)
        detail = r.json()["detail"]
        assert detail[0]["loc"] == ["body", "values", param] and why in detail[0]["msg"], (param, detail)
        assert f"'{param}'" in detail[0]["msg"]
    # An unknown environment is refused at use, as POST /jobs refuses it, not queued to fail.
    assert publish(world, "alice", "noenv", "name: x\ncommand: echo\nenvironment: nope\n").status_code == 201
    r = world.client.post(f"{API}/templates/noenv/use", json={"values": {}}, headers=world.as_("alice"))
    assert r.status_code == 422 and "environment 'nope' does not exist" in r.text, r.text
    shown = world.client.get(f"{API}/templates/train", headers=world.as_("alice")).json()
    assert shown["uses"] == 1  # refused uses count nothing
    # carol (nlp) cannot see a template shared with vision; public makes it hers too.
    assert world.client.get(f"{API}/templates/train", headers=world.as_("carol")).status_code == 404
    r = world.client.post(
        f"{API}/templates/train/share", json={"visibility": "public"}, headers=world.as_("alice")
    )
    assert r.status_code == 200, r.text
    assert world.client.get(f"{API}/templates/train", headers=world.as_("carol")).status_code == 200


def test_template_publish_refuses_undeclared_references_and_bad_declarations(world: World) -> None:
    r = publish(world, "alice", "t1", "name: x\ncommand: echo ${nope}\n")
    assert r.status_code == 422 and "'${nope}' names no declared parameter" in r.text, r.text
    r = publish(
        world,
        "alice",
        "t2",
        {"parameters": {"n": {"type": "int", "default": 9, "max": 4}}, "name": "x", "command": "echo ${n}"},
    )
    assert r.status_code == 422 and "parameter 'n'" in r.text and "maximum" in r.text, r.text
    r = publish(world, "alice", "t3", "name: x\ncommand: echo hi\nresources: {gpus: -1}\n")
    assert r.status_code == 422 and "gpus" in r.text, r.text
    assert world.client.get(f"{API}/templates", headers=world.as_("alice")).json() == []


def finished_job(
    world: World, user: str, files: dict[str, bytes], settings_root: Path, state: str = "succeeded"
) -> int:
    r = world.client.post(
        f"{API}/jobs",
        json={"name": "trainer", "command": "python train.py", "environment": "default"},
        headers=world.as_(user),
    )
    assert r.status_code == 201, r.text
    job_id = int(r.json()["id"])
    with world.session_factory() as db:
        db.execute(sa.update(Job).where(Job.id == job_id).values(state=state, finished_at=time.time()))
        db.commit()
    top = outputs_dir(settings_root, job_id)
    for rel, data in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_bytes(data)
    return job_id


def test_model_register_lineage_promote_and_refusals(world: World, settings: Any) -> None:
    root = settings.storage_path
    with world.session_factory() as db:
        add_node(db, gpus=2)
        db.commit()
    metrics = {"accuracy": 0.91, "loss": 0.3}
    job = finished_job(
        world,
        "alice",
        {"model/w.bin": b"weights", "model/metrics.json": json.dumps(metrics).encode(), "log.txt": b"x"},
        root,
    )
    alice = world.as_("alice")
    outside = {"../1/model": "outside", "/etc": "outside the job's outputs", "model/../../x": "outside"}
    for path, why in outside.items():
        r = world.client.post(
            f"{API}/models/digits/versions", json={"job_id": job, "path": path}, headers=alice
        )
        assert r.status_code == 422 and why in r.text, (path, r.text)
    os.symlink("/etc", outputs_dir(root, job) / "model" / "etc")
    r = world.client.post(
        f"{API}/models/digits/versions", json={"job_id": job, "path": "model"}, headers=alice
    )
    assert r.status_code == 409 and "symlink" in r.text, r.text
    os.unlink(outputs_dir(root, job) / "model" / "etc")
    assert world.client.get(f"{API}/models", headers=alice).json() == []  # nothing partial
    assert not [p for p in (root / "model").rglob("*") if p.is_file()]

    body = {
        "job_id": job,
        "path": "/outputs/model",
        "framework": "sklearn",
        "metrics": {"loss": 0.25},
        "card": "# Digits\n",
        "code_checksum": "abc123",
    }
    r = world.client.post(f"{API}/models/digits/versions", json=body, headers=alice)
    assert r.status_code == 201, r.text
    v1 = r.json()
    assert v1["version"] == 1 and v1["stage"] == "none" and v1["files"] == 2
    assert v1["metrics"] == {"accuracy": 0.91, "loss": 0.25}  # given wins over metrics.json
    lineage = v1["lineage"]
    assert (
        lineage["job_id"] == job
        and lineage["spec"]["name"] == "trainer"
        and lineage["environment"] == "default"
    )
    assert lineage["code_checksum"] == "abc123" and lineage["user"] == "alice"
    r = world.client.post(
        f"{API}/models/digits/versions", json={"job_id": job, "path": "model"}, headers=alice
    )
    assert r.status_code == 201 and r.json()["version"] == 2

    stage = f"{API}/models/digits/versions/1/stage"
    r = world.client.post(stage, json={"stage": "production"}, headers=alice)
    assert r.status_code == 409 and "'none'" in r.text and "'production'" in r.text, r.text
    for s in ("staging", "production"):
        assert world.client.post(stage, json={"stage": s}, headers=alice).status_code == 200
    r = world.client.post(f"{API}/models/digits/versions/2/stage", json={"stage": "staging"}, headers=alice)
    r = world.client.post(
        f"{API}/models/digits/versions/2/stage", json={"stage": "production"}, headers=alice
    )
    assert r.status_code == 200 and r.json()["archived"] == [1]
    assert world.client.post(stage, json={"stage": "bogus"}, headers=alice).status_code == 422
    assert world.client.post(stage, json={"stage": "staging"}, headers=world.as_("carol")).status_code == 404
    cmp = world.client.get(f"{API}/models/digits/compare", params={"a": 1, "b": 2}, headers=alice).json()
    assert {m["metric"]: m["delta"] for m in cmp["metrics"]} == pytest.approx({"accuracy": 0.0, "loss": 0.05})

    # A queued job mounting v2 holds it: deleting is refused naming the job.
    r = world.client.post(
        f"{API}/jobs",
        json={"name": "ft", "command": "true", "mounts": [{"source": "model/digits"}]},
        headers=alice,
    )
    assert r.status_code == 201, r.text
    user_job = r.json()
    assert user_job["spec"]["mounts"][0]["source"] == "model/digits@2"  # pinned to production
    r = world.client.delete(f"{API}/models/digits/versions/2", headers=alice)
    assert r.status_code == 409 and str(user_job["id"]) in r.text, r.text
    # Deleting the source job keeps the model's files and lineage.
    world.client.post(f"{API}/jobs/{user_job['id']}/cancel", headers=alice)
    assert world.client.delete(f"{API}/jobs/{job}", headers=alice).status_code == 204
    assert not outputs_dir(root, job).exists()
    files = world.client.get(f"{API}/models/digits/versions/1/files", headers=alice).json()["items"]
    assert sorted(f["path"] for f in files) == ["metrics.json", "w.bin"]
    r = world.client.get(f"{API}/models/digits/versions/1/file", params={"path": "w.bin"}, headers=alice)
    assert r.content == b"weights"
    assert (
        world.client.get(f"{API}/models/digits/versions/1", headers=alice).json()["lineage"]["job_id"] == job
    )
    assert world.client.delete(f"{API}/models/digits/versions/2", headers=alice).status_code == 204


def test_retention_removes_the_job_and_keeps_the_model(world: World, settings: Any) -> None:
    root = settings.storage_path
    job = finished_job(world, "alice", {"w.bin": b"kept"}, root)
    r = world.client.post(f"{API}/models/kept/versions", json={"job_id": job}, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    with world.session_factory() as db:
        deleted = cleanup.delete_expired_jobs(db, cast(Any, None), time.time() + 10, 1.0, storage_root=root)
    assert deleted == [job] and not outputs_dir(root, job).exists()
    r = world.client.get(
        f"{API}/models/kept/versions/1/file", params={"path": "w.bin"}, headers=world.as_("alice")
    )
    assert r.status_code == 200 and r.content == b"kept"


def test_a_deleted_model_versions_number_is_never_given_again(world: World, settings: Any) -> None:
    # v2 (the latest) deleted, the next registration became v2 again: `model/name@2` as a job
    # pinned it then meant other weights.
    alice, root = world.as_("alice"), settings.storage_path
    for version, weights in ((1, b"one"), (2, b"two")):
        job = finished_job(world, "alice", {"w.bin": weights}, root)
        r = world.client.post(f"{API}/models/renum/versions", json={"job_id": job}, headers=alice)
        assert r.status_code == 201 and r.json()["version"] == version, r.text
    assert world.client.delete(f"{API}/models/renum/versions/2", headers=alice).status_code == 204
    job = finished_job(world, "alice", {"w.bin": b"three"}, root)
    r = world.client.post(f"{API}/models/renum/versions", json={"job_id": job}, headers=alice)
    assert r.status_code == 201 and r.json()["version"] == 3, r.text
    assert world.client.get(f"{API}/models/renum/versions/2", headers=alice).status_code == 404
    assert [
        v["version"] for v in world.client.get(f"{API}/models/renum", headers=alice).json()["versions"]
    ] == [1, 3]


def test_deleting_a_model_a_job_mounts_names_the_versions_in_use(world: World, settings: Any) -> None:
    # `corral model rm digits` (two versions, v1 mounted) answered "model 'digits' its versions
    # is mounted by jobs not yet ended: 14", naming neither version.
    alice, root = world.as_("alice"), settings.storage_path
    for weights in (b"one", b"two"):
        job = finished_job(world, "alice", {"w.bin": weights}, root)
        r = world.client.post(f"{API}/models/inuse/versions", json={"job_id": job}, headers=alice)
        assert r.status_code == 201, r.text
    spec = {"name": "reads", "command": "true", "mounts": [{"source": "model/inuse@1"}]}
    r = world.client.post(f"{API}/jobs", json=spec, headers=alice)
    assert r.status_code == 201, r.text
    reader = r.json()["id"]
    r = world.client.delete(f"{API}/models/inuse", headers=alice)
    assert r.status_code == 409, r.text
    assert r.json()["detail"] == f"model 'inuse' v1 is mounted by jobs not yet ended: {reader}", r.text
    r = world.client.delete(f"{API}/models/inuse/versions/1", headers=alice)
    assert r.status_code == 409 and "model 'inuse' v1 is mounted by" in r.json()["detail"], r.text


def test_a_metrics_json_nested_too_deeply_is_skipped_like_an_unreadable_one(
    world: World, settings: Any
) -> None:
    # A job's metrics.json of 2,000 nested objects made `corral model register` answer 400 "the
    # request body is nested too deeply to parse": the parser's RecursionError escaped
    # read_metrics, whose metrics are optional ({} when unreadable).
    deep = ('{"x":' * 2000 + "1" + "}" * 2000).encode()
    shallow = json.dumps({"a": {"b": {"c": 0.5}}}).encode()
    alice = world.as_("alice")
    for name, metrics_json in (("deep", deep), ("shallow", shallow)):
        job = finished_job(
            world, "alice", {"m/w.bin": b"w", "m/metrics.json": metrics_json}, settings.storage_path
        )
        body = {"job_id": job, "path": "m", "metrics": {"f1": 0.8}}
        r = world.client.post(f"{API}/models/{name}/versions", json=body, headers=alice)
        assert r.status_code == 201, r.text
        expected = {"f1": 0.8} if name == "deep" else {"a.b.c": 0.5, "f1": 0.8}
        assert r.json()["metrics"] == expected, r.text


@pytest.mark.parametrize(
    ("odd", "words"),
    [
        (b"bad-\xff.bin", "'bad-\\\\xff.bin' is not a UTF-8 file name"),
        (b"a\tb", "holds a control character"),
    ],
)
def test_an_output_name_a_manifest_cannot_carry_is_refused_leaving_nothing(
    world: World, settings: Any, odd: bytes, words: str
) -> None:
    # A job's file named b"bad-\xff.bin" made `corral model register` a 500 (UnicodeEncodeError
    # hashing the manifest) and left its copy in model/.staging; a tab in a name would split a
    # "path<TAB>size<TAB>sha256" line.
    root = settings.storage_path
    job = finished_job(world, "alice", {"m/ok.bin": b"w"}, root)
    with open(bytes(outputs_dir(root, job)) + b"/m/" + odd, "wb") as f:  # a job may name files anything
        f.write(b"x")
    body = {"job_id": job, "path": "m"}
    r = world.client.post(f"{API}/models/odd/versions", json=body, headers=world.as_("alice"))
    assert r.status_code == 409 and words in r.json()["detail"], r.text
    assert list((root / "model" / ".staging").iterdir()) == []
    assert world.client.get(f"{API}/models/odd", headers=world.as_("alice")).status_code == 404


def test_every_file_a_version_lists_downloads_whatever_its_name(world: World, settings: Any) -> None:
    # A job's `/outputs/m/.hidden`, `my weights (1).bin`, a name of 80 characters or `ümlaut.txt`
    # were registered (a version of them all) but `corral model pull` stopped at the first with
    # "path component '.hidden' is not a valid name": GET .../file took the path for a user or
    # group name (letters, digits, '_', '.', '-', at most 64), so those files could never be read.
    alice = world.as_("alice")
    names = {
        ".hidden": b"h",
        "my weights (1).bin": b"w",
        f"sub dir/{'x' * 80}.pt": b"long",
        "ümlaut.txt": b"u",
    }
    job = finished_job(world, "alice", {f"m/{k}": v for k, v in names.items()}, settings.storage_path)
    r = world.client.post(f"{API}/models/odd/versions", json={"job_id": job, "path": "m"}, headers=alice)
    assert r.status_code == 201, r.text
    listed = world.client.get(f"{API}/models/odd/versions/1/files", headers=alice).json()["items"]
    assert sorted(f["path"] for f in listed) == sorted(names)
    for path, data in names.items():
        r = world.client.get(f"{API}/models/odd/versions/1/file", params={"path": path}, headers=alice)
        assert r.status_code == 200 and r.content == data, (path, r.text)
    for bad in ("../1/w.bin", "sub dir/../.hidden", "/etc/passwd", "a//b", "./x", "a\x01b"):
        r = world.client.get(f"{API}/models/odd/versions/1/file", params={"path": bad}, headers=alice)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "path"], (bad, r.text)
    r = world.client.get(f"{API}/models/odd/versions/1/file", params={"path": "nope.bin"}, headers=alice)
    assert r.status_code == 404 and "has no file 'nope.bin'" in r.text, r.text


def test_a_bad_catalogue_name_is_refused_in_words(world: World) -> None:
    # `corral template publish 'bad name' t.yaml` (and model register, env create) answered
    # "field 'name' 'bad name' does not match pattern ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$".
    alice = world.as_("alice")
    words = "is not a valid name: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
    for method, path, body, said in (
        ("POST", f"{API}/templates", {"name": "bad name", "spec": "name: x"}, "field 'name'"),
        ("GET", f"{API}/templates/odd~name", None, "path parameter 'name'"),
        ("GET", f"{API}/models/odd~name", None, "path parameter 'name'"),
        ("POST", f"{API}/models/odd~name/versions", {"job_id": 1}, "path parameter 'name'"),
        ("POST", f"{API}/environments", {"name": "bad name", "source": "numpy\n"}, "field 'name'"),
        ("GET", f"{API}/environments/odd~name", None, "path parameter 'name'"),
    ):
        r = world.client.request(method, path, json=body, headers=alice)
        assert r.status_code == 422, (path, r.text)
        value = "bad name" if body and "name" in body else "odd~name"
        assert r.json()["detail"][0]["msg"] == f"{said} {value!r} {words}", (path, r.text)


def test_a_bad_model_version_reference_is_refused_in_words(world: World) -> None:
    # GET /models/NAME/versions/bogus answered "does not match pattern ^([vV]?0*[1-9][0-9]{0,8}|none|...".
    r = world.client.get(f"{API}/models/digits/versions/bogus", headers=world.as_("alice"))
    assert r.status_code == 422 and r.json()["detail"][0]["msg"] == (
        "path parameter 'version' 'bogus' is not a version: write a number such as 3 or v3, or a stage "
        "(none, staging, production, archived)"
    ), r.text


def test_a_path_under_the_outputs_is_registered_whatever_its_name(world: World, settings: Any) -> None:
    # `corral model register m --job J --path "my model"` answered "path 'my model' is outside the
    # job's outputs or not a plain path: path component 'my model' is not a valid name": the path
    # was checked as a user or group name, though the job's files in it are copied whatever theirs.
    alice = world.as_("alice")
    files = {"my model/w.bin": b"w", ".best/sub dir/w.bin": b"b", "ünï/w.bin": b"u"}
    job = finished_job(world, "alice", files, settings.storage_path)
    for number, path in enumerate(("my model", "/outputs/.best/sub dir/", "ünï"), start=1):
        assert re.fullmatch(PATH_PATTERN, path), path  # the schema states it too
        r = world.client.post(
            f"{API}/models/spaced/versions", json={"job_id": job, "path": path}, headers=alice
        )
        assert r.status_code == 201 and r.json()["version"] == number, (path, r.text)
        assert r.json()["files"] == 1, r.text
        assert r.json()["source_path"] == path.strip("/").removeprefix("outputs/"), r.text
    for path in ("../1/x", "my model/../..", "a//b", "./x"):
        assert not re.fullmatch(PATH_PATTERN, path), path
        r = world.client.post(
            f"{API}/models/spaced/versions", json={"job_id": job, "path": path}, headers=alice
        )
        assert r.status_code == 422 and "outside the job's outputs or not a plain path" in r.text, (
            path,
            r.text,
        )


def test_every_data_and_catalogue_operation_is_described_in_the_api_docs(world: World) -> None:
    # /docs listed 16 of these operations (GET /datasets/{name}, GET /models, the model file
    # routes, template share and delete, ...) with their path and nothing about what they do.
    spec = world.client.get("/openapi.json").json()
    undescribed = [
        f"{method.upper()} {path}"
        for path, operations in spec["paths"].items()
        if re.search(r"/(datasets|environments|templates|models|storage)\b", path)
        for method, operation in operations.items()
        if not operation.get("description", "").strip()
    ]
    assert undescribed == []
