"""Templates and models end to end on a real server (local engine, bubblewrap) through the CLI:
a template used with `--set` (a bad value refused naming the parameter), its job's outputs
registered as a model with lineage, promoted, and mounted read-only into a fine-tune job that
reads it; deleting a version a running job mounts is refused naming the job; a clone with
`corral submit --from-job`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from corral.sdk import Client
from tests.server_fixture import CorralServer, start_server

pytestmark = pytest.mark.isolation
SMALL = {"cpus": 0.25, "memory": "128MiB"}
TRAIN = """
parameters:
  epochs: {type: int, default: 1, min: 1, max: 5, description: passes over the data}
  tag: {type: choice, choices: [a, b], default: a}
name: train-${tag}
command: >-
  mkdir -p /outputs/model && echo "weights-${epochs}" > /outputs/model/weights.txt &&
  echo '{"accuracy": 0.9${epochs}}' > /outputs/model/metrics.json && cat /data/pets/labels.txt
resources: {cpus: 0.25, memory: 128MiB}
mounts: [{source: data/pets}]
"""
FINETUNE = """
name: finetune
command: >-
  cat /models/digits/weights.txt; touch /models/digits/new 2>/dev/null && echo WROTE || echo READ-ONLY
resources: {cpus: 0.25, memory: 128MiB}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    srv = start_server(tmp_path_factory.mktemp("catalog") / "home", allow_unisolated=False)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def alice(server: CorralServer) -> Iterator[str]:
    with Client(server.url, server.token) as admin:
        admin.create_group("vision")
        admin.create_user("alice", groups=["vision"], default_group="vision")
        yield admin.create_token("alice-t", user="alice")["token"]


def corral(server: CorralServer, token: str, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args), env={"CORRAL_URL": server.url, "CORRAL_TOKEN": token})
    assert result.exit_code == code, result.output
    return result.output


def job_id_of(output: str) -> int:
    found = re.search(r"job (\d+)", output)
    assert found, output
    return int(found.group(1))


def test_template_model_finetune_round_trip(server: CorralServer, alice: str, tmp_path: Path) -> None:
    (tmp_path / "pets").mkdir()
    (tmp_path / "pets" / "labels.txt").write_text("cat\ndog\n")
    with Client(server.url, alice) as c:
        c.push_dataset("pets", tmp_path / "pets")
    (tmp_path / "train.yaml").write_text(TRAIN)
    (tmp_path / "ft.yaml").write_text(FINETUNE)
    corral(server, alice, "template", "publish", "train", str(tmp_path / "train.yaml"))
    corral(server, alice, "template", "publish", "ft", str(tmp_path / "ft.yaml"))
    refused = corral(server, alice, "template", "use", "train", "--set", "epochs=9", code=1)
    assert "parameter 'epochs'" in refused and "maximum" in refused
    refused = corral(server, alice, "template", "use", "train", "--set", "tag=c", code=1)
    assert "parameter 'tag'" in refused
    listed = corral(server, alice, "template", "ls")
    assert "train" in listed and "epochs, tag" in listed
    shown = corral(server, alice, "template", "show", "train")
    assert re.search(r"epochs\s.*\sint\s.*\s1\.\.5\s", shown), shown  # as written, not 1.0..5.0

    c = Client(server.url, alice)
    train = job_id_of(
        corral(server, alice, "template", "use", "train", "--set", "epochs=3", "--set", "tag=b")
    )
    job = c.wait(train, timeout_s=60)
    assert job["state"] == "succeeded" and job["name"] == "train-b", c.logs(train)["data"]
    assert c.template("train")["uses"] == 1

    refused = corral(
        server, alice, "model", "register", "digits", "--job", str(train), "--path", "../", code=1
    )
    assert "outside the job's outputs" in refused
    out = corral(server, alice, "model", "register", "digits", "--job", str(train), "--path", "model",
                 "--framework", "sklearn", "--metric", "f1=0.8")  # fmt: skip
    assert "digits v1: 2 files" in out
    shown = corral(server, alice, "model", "show", "digits@1")
    assert f"lineage: job {train} (train-b)" in shown and "environment: default" in shown, shown
    assert "datasets: pets@1" in shown, shown
    assert '"accuracy": 0.93' in shown and '"f1": 0.8' in shown
    corral(server, alice, "model", "promote", "digits@1", "production", code=1)  # none -> production: no
    corral(server, alice, "model", "promote", "digits@1", "staging")
    assert "is now production" in corral(server, alice, "model", "promote", "digits@1", "production")

    ft = job_id_of(corral(server, alice, "model", "finetune", "digits@production", "--template", "ft"))
    job = c.wait(ft, timeout_s=60)
    log = c.logs(ft)["data"]
    assert job["state"] == "succeeded", log
    assert "weights-3" in log and "READ-ONLY" in log and "WROTE" not in log
    assert job["spec"]["mounts"] == [{"source": "model/digits@1", "target": "/models/digits", "mode": "ro"}]

    # A running job mounting v1 holds it.
    hold = c.submit(
        {"name": "hold", "command": "sleep 60", "resources": SMALL, "mounts": [{"source": "model/digits"}]}
    )
    refused = corral(server, alice, "model", "rm", "digits@1", code=1)
    assert str(hold["id"]) in refused and "mounted by jobs not yet ended" in refused
    c.cancel(hold["id"])
    c.wait(hold["id"], timeout_s=60)

    clone = job_id_of(corral(server, alice, "submit", "--from-job", str(train)))
    assert c.job(clone)["spec"]["tasks"] == job_spec_tasks(c, train)
    corral(server, alice, "model", "pull", "digits@1", str(tmp_path / "pulled"))
    assert (tmp_path / "pulled" / "weights.txt").read_text() == "weights-3\n"
    c.close()


def job_spec_tasks(c: Client, job_id: int) -> object:
    return c.job(job_id)["spec"]["tasks"]
