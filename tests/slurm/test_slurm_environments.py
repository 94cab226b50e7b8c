"""Catalogue environments end to end on the Slurm engine: a REAL Corral server (`CORRAL_ENGINE=slurm`)
over the session's real Slurm cluster, driven through the SDK and REST API.

`env create` queues a build job like any job of the user's: Slurm runs it as the user's own Unix
account (not root, not the server's), with the build step and uv the server published on the
storage root (`env/tools`) and the recorded interpreter `/usr/bin/python3` (the server's own venv
lives under /root, which job accounts cannot enter). It resolves offline from a wheel the test
builds (find-links), the env-builds loop moves its venv into the read-only store, and a job in the
environment on Slurm imports that package and not the server's. The same request again by the
same user is a cache hit (its build job installs nothing), by another user its own build;
malformed requirements fail with the build log shown and
nothing registered."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.sdk import ApiError, Client
from tests.environments.wheels import make_wheel
from tests.server_fixture import CorralServer, group_member_clients, start_server
from tests.slurm.conftest import cleanup_cluster
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster
from tests.slurm.helpers import server_env

pytestmark = pytest.mark.slurm
PKG = "corraltestpkg"
PYTHON = "/usr/bin/python3"  # the Slurm engine's default interpreter, readable by job accounts


@pytest.fixture(scope="module")
def server(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    cleanup_cluster(slurm_cluster)  # the cluster is shared with the other Slurm tests of the session
    wheels = slurm_cluster.new_state_dir() / "wheels"  # the admin's wheels: readable by job accounts
    make_wheel(wheels, PKG, "1.0", "VALUE = 42\n")
    srv = start_server(
        tmp_path_factory.mktemp("slurm-envs") / "home",
        extra_env={
            **server_env(slurm_cluster, slurm_cluster.new_state_dir()),
            "CORRAL_ENV_FIND_LINKS": str(wheels),
            # Build jobs are CPU jobs and every node of the test cluster has GPUs (on Slurm CPU
            # jobs keep off GPU nodes by default): a site without CPU nodes sets this too.
            "CORRAL_CPU_JOBS_ON_GPU_NODES": "true",
        },
    )
    try:
        yield srv
    finally:
        srv.stop()
        cleanup_cluster(slurm_cluster)


@pytest.fixture(scope="module")
def clients(server: CorralServer) -> Iterator[dict[str, Client]]:
    yield from group_member_clients(server, "vision", ("alice", "bob"))


def storage(server: CorralServer) -> Path:
    return Path(server.env["CORRAL_STORAGE_ROOT"])


def build(c: Client, name: str, source: str) -> dict:
    queued = c.create_environment(name, source)
    assert queued["state"] == "building" and queued["build_job_id"], queued
    return c.wait_environment(name, queued["version"], timeout_s=180, poll_s=0.3)


def slurm_user_of(cluster: SlurmCluster, server: CorralServer, job_id: int) -> str:
    """The Unix account Slurm ran the Corral job's (first) attempt as, by its job name and its
    working dir under this server's state dir (the cluster also runs other tests' jobs)."""
    state_dir = server.env["CORRAL_SLURM_STATE_DIR"]
    out = subprocess.run(
        ["squeue", "-h", "--states=all", f"--name=corral-{job_id}.1", "-o", "%u|%Z"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=15,
        check=True,
    ).stdout
    users = [u for u, _, wd in (ln.partition("|") for ln in out.splitlines()) if wd.startswith(state_dir)]
    assert len(users) == 1, out
    return users[0]


def test_build_job_on_slurm_then_a_job_in_the_environment(
    server: CorralServer, clients: dict[str, Client], slurm_cluster: SlurmCluster
) -> None:
    alice, bob = clients["alice"], clients["bob"]
    first = build(alice, "tpkg", f"{PKG}==1.0\n")
    log = alice.logs(first["build_job_id"])["data"]
    assert first["state"] == "ready", (first, log)
    assert first["interpreter"] == PYTHON and first["cache_hit"] is False, first
    assert f"{PKG}==1.0" in (first["lock"] or ""), first
    # Built by Slurm as alice's own account, with the tools the server published on the storage
    # root and the system interpreter (nothing of the server's venv under /root).
    assert slurm_user_of(slurm_cluster, server, first["build_job_id"]) == TEST_ACCOUNTS["alice"]
    assert f"resolving requirements.in for {PYTHON} with uv /corral/tools/uv-" in log, log
    assert "uv venv" in log and f"built {first['cache_key']}" in log and "/root/" not in log, log
    tools = storage(server) / "env" / "tools"
    published = sorted(os.listdir(tools))
    assert [n.split("-")[0] for n in published] == ["buildstep", "uv"], published
    assert all(os.stat(tools / n).st_uid == 0 and not os.stat(tools / n).st_mode & 0o222 for n in published)
    copy = storage(server) / "env" / "store" / first["cache_key"]
    assert copy.is_dir() and os.stat(copy).st_uid == 0 and stat.S_IMODE(os.stat(copy).st_mode) == 0o555

    job = alice.submit(
        {
            "name": "in-env",
            "environment": "tpkg",
            "resources": {"cpus": 1, "memory": "256MiB"},
            "command": f"python -c 'import {PKG}, sys; print(\"VALUE\", {PKG}.VALUE, sys.base_prefix)'; "
            "python -c 'import yaml' 2>/dev/null; echo yaml=$?; command -v python; echo uid=$(id -u); "
            "touch /env/tpkg/x 2>/dev/null; echo touch=$?",
        }
    )
    assert job["environment_version"] == "tpkg@1", job
    job = alice.wait(job["id"], timeout_s=90)
    out = alice.logs(job["id"])["data"]
    assert job["state"] == "succeeded", out
    assert "VALUE 42 /usr\n" in out, out  # the environment's package, on the system interpreter
    assert "yaml=1" in out, out  # the server's pyyaml is not there
    assert "/env/tpkg/bin/python" in out and "touch=0" not in out, out  # first on PATH; read-only
    assert f"uid={pwd.getpwnam(TEST_ACCOUNTS['alice']).pw_uid}" in out, out

    # The same request by the same user: the lock resolves to the same key, nothing is installed.
    second = build(alice, "tpkg-again", f"{PKG}==1.0\n")
    log2 = alice.logs(second["build_job_id"])["data"]
    assert second["state"] == "ready", (second, log2)
    assert second["cache_hit"] is True and second["cache_key"] == first["cache_key"], second
    assert "cache hit" in log2 and "uv venv" not in log2 and "pip install" not in log2, log2
    assert sorted(os.listdir(storage(server) / "env" / "store")) == [first["cache_key"]]
    cold = first["built_at"] - first["created_at"]
    warm = second["built_at"] - second["created_at"]
    print(f"\n[slurm envs] build: cold {cold:.2f} s, cached {warm:.2f} s")

    # By another user: alice's account (her login shell) could write that build's outputs, so
    # bob's build makes its own copy under its own key (review104, finding 2).
    third = build(bob, "tpkg-bob", f"{PKG}==1.0\n")
    log3 = bob.logs(third["build_job_id"])["data"]
    assert third["state"] == "ready", (third, log3)
    assert third["cache_hit"] is False and third["cache_key"] != first["cache_key"], third
    assert "uv venv" in log3 and f"built {third['cache_key']}" in log3, log3
    assert slurm_user_of(slurm_cluster, server, third["build_job_id"]) == TEST_ACCOUNTS["bob"]
    assert sorted(os.listdir(storage(server) / "env" / "store")) == sorted(
        [first["cache_key"], third["cache_key"]]
    )


def test_malformed_requirements_fail_with_the_log_and_nothing_registered(
    server: CorralServer, clients: dict[str, Client]
) -> None:
    alice = clients["alice"]
    store = storage(server) / "env" / "store"
    before = set(os.listdir(store)) if store.is_dir() else set()
    failed = build(alice, "broken", f"{PKG} >>= 1.0 !!\n")
    assert failed["state"] == "failed" and failed["cache_key"] is None and failed["lock"] is None, failed
    assert "build job" in failed["error"] and ">>=" in failed["error"], failed  # uv's complaint
    log = alice.logs(failed["build_job_id"])["data"]
    assert "failed with exit code" in log and ">>=" in log, log
    assert (set(os.listdir(store)) if store.is_dir() else set()) == before  # nothing in the store
    outputs = storage(server) / "outputs" / str(failed["build_job_id"])
    assert not (outputs / "venv").exists()
    with pytest.raises(ApiError) as refused:
        alice.submit({"name": "x", "command": "true", "environment": "broken@1"})
    assert refused.value.status_code == 422 and "broken@1 is failed" in refused.value.message


def test_a_model_version_is_bound_read_only_and_counted_in_its_owners_usage(
    server: CorralServer, clients: dict[str, Client], slurm_cluster: SlurmCluster
) -> None:
    """The model registry's `model/` mount source on Slurm: a version registered from a Slurm job's
    outputs is bound read-only at /models/<name> in another Slurm job, and its files count in its
    owner's storage usage (registered within the quota, taken off when deleted)."""
    alice, admin = clients["alice"], clients["admin"]
    train = alice.submit(
        {
            "name": "train",
            "resources": {"cpus": 1, "memory": "256MiB"},
            "command": "mkdir -p /outputs/model && head -c 30000 /dev/zero > /outputs/model/weights.bin "
            "&& echo '{\"accuracy\": 0.93}' > /outputs/model/metrics.json",
        }
    )
    train = alice.wait(train["id"], timeout_s=90)
    assert train["state"] == "succeeded", alice.logs(train["id"])["data"]

    def usage() -> dict:
        rows = [r for r in alice.storage_usage() if (r["scope"], r["name"]) == ("user", "alice")]
        return rows[0] if rows else {"dataset_bytes": 0, "used_bytes": 0}

    before = usage()
    v1 = alice.register_model("digits", train["id"], path="model")
    assert v1["version"] == 1 and v1["files"] == 2 and v1["bytes"] > 30000, v1
    after = usage()
    assert after["dataset_bytes"] - before["dataset_bytes"] == v1["bytes"], (before, after)
    # Over the owner's quota: refused, nothing kept, the usage unchanged.
    admin.set_storage_quota("user", "alice", max_bytes=after["used_bytes"] + 100)
    with pytest.raises(ApiError) as over:
        alice.register_model("digits", train["id"], path="model")
    assert over.value.status_code == 403 and "model 'digits'" in over.value.message, over.value.message
    admin.set_storage_quota("user", "alice", max_bytes=None)
    assert [v["version"] for v in alice.model("digits")["versions"]] == [1]
    assert usage()["dataset_bytes"] == after["dataset_bytes"]

    job = alice.submit(
        {
            "name": "finetune",
            "resources": {"cpus": 1, "memory": "256MiB"},
            "mounts": [{"source": "model/digits"}],
            "command": "wc -c < /models/digits/weights.bin; "
            "touch /models/digits/new 2>/dev/null && echo WROTE || echo READ-ONLY",
        }
    )
    assert [m["source"] for m in job["spec"]["mounts"]] == ["model/digits@1"], job["spec"]  # pinned
    job = alice.wait(job["id"], timeout_s=90)
    out = alice.logs(job["id"])["data"]
    assert job["state"] == "succeeded" and "30000\n" in out and "READ-ONLY" in out, out
    assert slurm_user_of(slurm_cluster, server, job["id"]) == TEST_ACCOUNTS["alice"]

    alice.delete_model("digits", 1)
    assert usage()["dataset_bytes"] == before["dataset_bytes"]
