"""`corral model show` and `model pull` with the references the other model commands take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.sdk import Client
from tests.api.conftest import World
from tests.api.test_catalog import finished_job
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture
API = "/api/v1"


def test_model_show_and_pull_take_a_stage_like_finetune_and_mounts(
    world: World, server_url: str, settings: Any, tmp_path: Path
) -> None:
    # docs/catalogues.md: a version is named NAME@VERSION or NAME@STAGE (`model finetune
    # digits@production`, `model/digits@production`); show and pull refused the stage ("write
    # NAME@VERSION").
    alice = world.as_("alice")
    for weights in (b"one", b"two"):
        job = finished_job(world, "alice", {"w.bin": weights}, settings.storage_path)
        r = world.client.post(f"{API}/models/digits/versions", json={"job_id": job}, headers=alice)
        assert r.status_code == 201, r.text
    for stage in ("staging", "production"):
        r = world.client.post(f"{API}/models/digits/versions/1/stage", json={"stage": stage}, headers=alice)
        assert r.status_code == 200, r.text
    code, out = run(world, server_url, "alice", "model", "show", "digits@production", "-o", "json")
    assert code == 0 and json.loads(out)["version"] == 1, out
    code, out = run(world, server_url, "alice", "model", "show", "digits@v2")
    assert code == 0 and "digits@2" in out, out
    code, out = run(world, server_url, "alice", "model", "pull", "digits@production", str(tmp_path / "p"))
    assert code == 0 and (tmp_path / "p" / "w.bin").read_bytes() == b"one", out
    code, out = run(world, server_url, "alice", "model", "pull", "digits@2", str(tmp_path / "two"))
    assert code == 0 and (tmp_path / "two" / "w.bin").read_bytes() == b"two", out
    code, out = run(world, server_url, "alice", "model", "show", "digits@prod")
    assert code == 1 and "write NAME@VERSION or NAME@STAGE" in out and "production" in out, out
    code, out = run(world, server_url, "alice", "model", "pull", "digits@staging", str(tmp_path / "s"))
    assert code == 1 and "has no version in stage 'staging'" in out and not (tmp_path / "s").exists(), out
    code, out = run(world, server_url, "alice", "model", "show", "digits@7")
    assert code == 1 and "has no version v7 (it has v1, v2)" in out, out
    with Client(server_url, alice["Authorization"].split()[1]) as c:
        assert c.model_version("digits", "production")["version"] == 1


def _two_versions(world: World, settings: Any) -> None:
    for metrics in ({"acc": 0.9, "loss": 0.3}, {"acc": 0.95}):
        job = finished_job(world, "alice", {"w.bin": b"w"}, settings.storage_path)
        body = {"job_id": job, "metrics": metrics}
        r = world.client.post(f"{API}/models/digits/versions", json=body, headers=world.as_("alice"))
        assert r.status_code == 201, r.text


def test_model_share_says_with_whom(world: World, server_url: str, settings: Any) -> None:
    """`corral model share digits group --group vision` printed "model digits is group"."""
    _two_versions(world, settings)
    code, out = run(world, server_url, "alice", "model", "share", "digits", "group", "--group", "vision")
    assert code == 0 and "model digits is shared with group vision" in out, out
    code, out = run(world, server_url, "alice", "model", "share", "digits", "public")
    assert code == 0 and "model digits is public" in out, out
    # without a group the refusal says how to name one in the CLI, not only the API's field
    code, out = run(world, server_url, "alice", "template", "publish", "t", "--from-job", "1")
    assert code == 0, out
    code, out = run(world, server_url, "alice", "template", "share", "t", "group")
    assert code == 1 and "needs a group: name one with 'group' (`--group` in the CLI)" in out, out


def test_model_compare_prints_a_dash_for_a_metric_one_version_lacks(
    world: World, server_url: str, settings: Any
) -> None:
    """It printed "None"."""
    _two_versions(world, settings)
    code, out = run(world, server_url, "alice", "model", "compare", "digits", "1", "2")
    assert code == 0 and "None" not in out, out
    loss = next(line for line in out.splitlines() if "loss" in line)
    assert loss.replace("│", " ").split() == ["loss", "0.3", "-", "-"], out


def test_a_quota_refusal_names_the_models_new_version(world: World, settings: Any) -> None:
    """A registration over the owner's storage quota read "model 'digits''s new version"."""
    _two_versions(world, settings)
    r = world.client.put(f"{API}/storage/quota/user/alice", json={"max_bytes": 1}, headers=world.as_("admin"))
    assert r.status_code == 200, r.text
    job = finished_job(world, "alice", {"w.bin": b"big"}, settings.storage_path)
    r = world.client.post(f"{API}/models/digits/versions", json={"job_id": job}, headers=world.as_("alice"))
    assert r.status_code == 403 and "the new version of model 'digits'" in r.text, r.text
    assert "''s" not in r.text, r.text


def test_model_ls_names_the_group_a_model_is_shared_with(
    world: World, server_url: str, settings: Any
) -> None:
    """SHARED said "group" without which one (`corral template ls` says "group (vision)")."""
    job = finished_job(world, "alice", {"w.bin": b"w"}, settings.storage_path)
    body = {"job_id": job, "group": "vision"}
    r = world.client.post(f"{API}/models/digits/versions", json=body, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    code, out = run(world, server_url, "alice", "model", "ls")
    row = next(line for line in out.splitlines() if "digits" in line)
    assert code == 0 and "group (vision)" in row, out
