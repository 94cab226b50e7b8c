"""Datasets on a real server (tests/server_harness.py) through the CLI: push and pull give the
same bytes; a push killed mid-way, with the server killed too, resumes to identical checksums;
a group over its storage quota keeps its new jobs waiting with a reason; /metrics shows usage."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from tests.server_fixture import CorralServer, start_server, submit_spec, wait_for

CHUNK = 65536  # small chunks: a push takes long enough to be killed mid-way


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    srv = start_server(
        tmp_path_factory.mktemp("datasets") / "home", extra_env={"CORRAL_DATASET_CHUNK_BYTES": str(CHUNK)}
    )
    try:
        yield srv
    finally:
        srv.stop()


def corral(srv: CorralServer, *args: str, token: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"CORRAL_URL": srv.url, "CORRAL_TOKEN": token or srv.token, "CORRAL_HOME": str(srv.home / "cli")}
    return subprocess.Popen(
        [sys.executable, "-m", "corral.cli.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_cli(srv: CorralServer, *args: str, code: int = 0) -> str:
    """The CLI in this process (a subprocess only where one must be killed: starting Python is
    slow on a loaded machine)."""
    result = CliRunner().invoke(cli, list(args), env={"CORRAL_URL": srv.url, "CORRAL_TOKEN": srv.token})
    assert result.exit_code == code, result.output
    return result.output


def make_tree(top: Path, files: int, size: int, seed: int) -> None:
    for i in range(files):
        path = top / f"part{i % 3}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest() * (size // 32))


def checksums(top: Path) -> dict[str, str]:
    return {
        p.relative_to(top).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(top.rglob("*"))
        if p.is_file()
    }


def test_push_pull_identical_and_version_pin(server: CorralServer, tmp_path: Path) -> None:
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    make_tree(v1, 5, 40_000, seed=1)
    make_tree(v2, 6, 40_000, seed=2)
    (v1 / "empty.txt").write_bytes(b"")
    assert "dataset pets v1: 6 files" in run_cli(server, "data", "push", "pets", str(v1))
    assert "dataset pets v2: 6 files" in run_cli(server, "data", "push", "pets", str(v2))
    run_cli(server, "data", "pull", "pets", str(tmp_path / "latest"))
    run_cli(server, "data", "pull", "pets@1", str(tmp_path / "pinned"))
    assert checksums(tmp_path / "latest") == checksums(v2)
    assert checksums(tmp_path / "pinned") == checksums(v1)
    # Into a path that is a file: one line naming it, not a FileExistsError traceback.
    (tmp_path / "a-file").write_text("x")
    out = run_cli(server, "data", "pull", "pets", str(tmp_path / "a-file"), code=1)
    assert "a-file: File exists" in " ".join(out.split()) and "Traceback" not in out
    listed = run_cli(server, "data", "versions", "pets")
    assert "v1" in listed and "v2" in listed
    out = run_cli(server, "data", "push", "pets", str(v2), code=1)  # the same content again
    assert "v2 already holds exactly this content" in out


def test_a_transfer_refused_before_any_byte_prints_the_error_alone(
    server: CorralServer, tmp_path: Path
) -> None:
    """The progress bar started before the transfer: a refusal before any byte moved printed an
    empty bar ("pull nosuch ━━━ 0/? bytes ?") above the error."""
    out = run_cli(server, "data", "pull", "nosuch", str(tmp_path / "x"), code=1)
    assert out.strip() == "error: no dataset named 'nosuch'", out
    out = run_cli(server, "data", "push", "x", str(tmp_path / "missing"), code=1)
    assert out.strip() == f"error: {tmp_path / 'missing'} does not exist", out  # not "is not a directory"
    (tmp_path / "a-file").write_text("x")
    out = run_cli(server, "data", "push", "x", str(tmp_path / "a-file"), code=1)
    assert out.strip() == f"error: {tmp_path / 'a-file'} is not a directory", out
    make_tree(tmp_path / "small", 2, 4096, seed=3)
    out = run_cli(server, "data", "push", "small", str(tmp_path / "small"))
    assert "push small ━" in out and "dataset small v1: 2 files" in out, out  # a transfer still shows it


def test_share_says_who_may_read_when_nobody_but_the_owner_may(server: CorralServer, tmp_path: Path) -> None:
    """Taking the last reader away printed "readable by - (and its owner)"."""
    make_tree(tmp_path / "d", 1, 64, seed=4)
    run_cli(server, "data", "push", "shy", str(tmp_path / "d"))
    out = run_cli(server, "data", "share", "shy", "--public")
    assert out.strip() == "dataset shy: readable by everyone (and its owner)", out
    out = run_cli(server, "data", "share", "shy", "--private")
    assert out.strip() == "dataset shy: readable only by its owner (user admin)", out


def test_push_killed_mid_way_with_the_server_resumes_to_identical_checksums(
    server: CorralServer, tmp_path: Path
) -> None:
    source = tmp_path / "big"
    make_tree(source, 8, 2 * 1024 * 1024, seed=3)  # 16 MiB: 256 chunks
    total = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    client = server.client()
    proc = corral(server, "data", "push", "big", str(source))
    try:
        started = wait_for(
            lambda: [
                u for u in client.get("/api/v1/datasets/uploads").json() if u["received_bytes"] >= 4 * CHUNK
            ],
            timeout_s=60,
            interval_s=0.01,
            what="the push to send some chunks",
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    uid = started[0]["id"]
    server.kill()  # the server dies mid-upload too
    server.start()
    client = server.client()
    interrupted = client.get(f"/api/v1/datasets/uploads/{uid}").json()
    assert 0 < interrupted["received_bytes"] < total, interrupted
    assert client.get("/api/v1/datasets/big").status_code == 404  # nothing partial visible
    out = run_cli(server, "data", "push", "big", str(source))
    assert "dataset big v1: 8 files" in out and "(resumed)" in out
    assert client.get("/api/v1/datasets/uploads").json() == []
    run_cli(server, "data", "pull", "big", str(tmp_path / "back"))
    assert checksums(tmp_path / "back") == checksums(source)


def test_group_over_storage_quota_keeps_its_jobs_waiting(server: CorralServer, tmp_path: Path) -> None:
    admin = server.client()
    assert admin.post("/api/v1/groups", json={"name": "vision"}).status_code == 201
    r = admin.post("/api/v1/users", json={"name": "alice", "groups": ["vision"], "default_group": "vision"})
    assert r.status_code == 201, r.text
    token = admin.post("/api/v1/tokens", json={"name": "t", "user": "alice"}).json()["token"]
    data = tmp_path / "d"
    make_tree(data, 2, 10_000, seed=4)
    run_cli(server, "data", "push", "vis", str(data), "--group", "vision")
    run_cli(server, "storage", "quota", "group", "vision", "--storage", "1KiB")
    alice = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    job = submit_spec(alice, {"name": "w", "command": "true", "resources": {"cpus": 1, "memory": "128MiB"}})
    why = wait_for(
        lambda: (d := alice.get(f"/api/v1/jobs/{job}").json()["diagnosis"]) and d,
        what="a diagnosis of the waiting job",
    )
    assert "storage quota" in str(why) and "group vision holds 19.5 KiB" in str(why), why
    assert alice.get(f"/api/v1/jobs/{job}").json()["state"] == "queued"
    metrics = admin.get("/metrics").text
    used = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    assert f'corral_storage_used_bytes{{scope="group",name="vision"}} {used}' in metrics
    assert 'corral_storage_quota_bytes{scope="group",name="vision"} 1024' in metrics
    usage = run_cli(server, "storage", "usage")
    assert "vision" in usage and "yes" in usage
    run_cli(server, "storage", "quota", "group", "vision", "--storage", "none")
    wait_for(
        lambda: alice.get(f"/api/v1/jobs/{job}").json()["state"] != "queued",
        what="the job to leave the queue",
    )


def test_rm_refused_while_a_submitted_job_uses_the_version(server: CorralServer, tmp_path: Path) -> None:
    make_tree(tmp_path / "d", 2, 1000, seed=5)
    data = server.home / "storage" / "data"
    before = set(data.glob("*/v1"))
    run_cli(server, "data", "push", "inuse", str(tmp_path / "d"))
    (version_dir,) = set(data.glob("*/v1")) - before  # the new dataset's first version
    admin = server.client()
    spec = {
        "name": "reader",
        "command": "sleep 60",
        "resources": {"cpus": 1, "memory": "64MiB"},
        "mounts": [{"source": "data/inuse"}],  # pinned to inuse@1 at submit, its lineage recorded
    }
    job = submit_spec(admin, spec)
    out = " ".join(run_cli(server, "data", "rm", "inuse@1", code=1).split())  # Rich wraps lines
    assert f"in use by 1 job that has not ended: {job};" in out
    assert admin.post(f"/api/v1/jobs/{job}/cancel").status_code == 200
    wait_for(lambda: admin.get(f"/api/v1/jobs/{job}").json()["state"] == "cancelled", what="the cancel")
    assert "deleted dataset inuse v1" in run_cli(server, "data", "rm", "inuse@1")
    assert not version_dir.exists()
