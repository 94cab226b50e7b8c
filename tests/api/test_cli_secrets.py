"""`corral secret` against a real uvicorn server: the value comes from stdin or a file (exact
bytes, not UTF-8 too), never from argv; `ls` shows names, never values; `rm` deletes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from corral.db.models import Job
from corral.services.secrets import box_for, grants_for_job
from tests.api.conftest import World
from tests.api.test_cli import server_url

__all__ = ["server_url"]  # the fixture


def secret_cli(world: World, url: str, user: str, *args: str, stdin: str | None = None) -> tuple[int, str]:
    token = world.as_(user)["Authorization"].split()[1]
    result = CliRunner().invoke(
        cli, ["secret", *args], input=stdin, env={"CORRAL_URL": url, "CORRAL_TOKEN": token}
    )
    return result.exit_code, result.output


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)  # the API rules run on both
def test_cli_sets_lists_and_removes_secrets(world: World, server_url: str, tmp_path: Path) -> None:
    code, out = secret_cli(world, server_url, "alice", "set", "wandb", stdin="cli-value-1\n")
    assert code == 0 and "set (11 bytes)" in out and "cli-value-1" not in out
    key = tmp_path / "id_rsa"
    key.write_bytes(b"\xffbinary key\n")
    code, out = secret_cli(
        world, server_url, "bob", "set", "deploy", "--group", "vision", "--from-file", str(key)
    )
    assert code == 0, out
    code, out = secret_cli(world, server_url, "alice", "set", "deploy", "-g", "vision", stdin="x")
    assert code == 1 and "only the admins of group 'vision' and Corral admins may change its secrets" in out
    code, out = secret_cli(world, server_url, "alice", "ls", "-o", "json")
    assert [(s["name"], s["scope"]) for s in json.loads(out)] == [("wandb", "user"), ("deploy", "group")]
    code, out = secret_cli(world, server_url, "alice", "ls")
    assert "wandb" in out and "group vision" in out and "cli-value-1" not in out
    # what a job of alice's in vision would get: stdin without its newline, the file's exact bytes
    spec = {
        "name": "j",
        "command": "true",
        "secrets": [{"name": "wandb", "env": "K"}, {"name": "deploy", "file": "k"}],
    }
    r = world.client.post("/api/v1/jobs", json=spec, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    with world.session_factory() as db:
        job = db.get(Job, r.json()["id"])
        assert job is not None
        values = [g.value for g in grants_for_job(db, box_for(world.client.app.state.settings), job)]
    assert values == [b"cli-value-1", b"\xffbinary key\n"]
    assert secret_cli(world, server_url, "alice", "rm", "wandb")[0] == 0
    code, out = secret_cli(world, server_url, "alice", "rm", "wandb")
    assert code == 1 and "you have no secret named 'wandb'" in out
