"""A workspace on the Slurm engine, end to end: a REAL Corral server (`CORRAL_ENGINE=slurm`) over
the session's REAL Slurm cluster. The workspace is a Slurm job running JupyterLab on its node,
as the user's mapped Unix account inside the node's bubblewrap sandbox, listening on the node's
address; the server reaches it over that address:

- through the proxy: /ws/<id>/api/status answers the owner (200), redirects nobody to the login
  (302) and answers another user as for a missing workspace (404); a kernel started through
  the proxy runs code over its WebSocket (one round trip) and reports the account's uid and the
  Slurm node's hostname, and so does a JupyterLab terminal;
- straight to the node's port, without Corral's credential, JupyterLab refuses (403);
- the idle policy's reader finds the kernel's activity there;
- through the SSH gateway with OpenSSH: `id -u` and `hostname` inside the workspace are the
  mapped account's uid and the Slurm node (the gateway enters through `srun --overlap`);
- a server SIGKILLed and started again reaches the same kernel; a stopped workspace is refused.

The job accounts cannot read the server's venv here (its interpreter lives below /root, 0700),
so the test provides what an admin provides: a venv with Corral and jupyterlab at a path they
can read (`CORRAL_WORKSPACE_VENV`; docs/workspaces.md), made by hard-linking the test venv's
packages onto the system python3.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from corral.db.session import make_engine, make_session_factory
from corral.workspaces.activity import last_activity
from tests.server_fixture import CorralServer, start_server, submit_spec, wait_for, wait_state
from tests.slurm.conftest import cleanup_cluster
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster, free_port
from tests.slurm.helpers import server_env, slurm_engine
from tests.support import require_binary
from tests.workspaces.kernel_client import run_in_kernel

pytestmark = pytest.mark.slurm
API = "/api/v1"
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes"]
SSH_OPTS += ["-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10"]
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"


def workspace_venv(where: Path) -> Path:
    """A venv on the system python3 (which every job account can run): the test venv hard-linked
    (about a second; its `etc/jupyter` enables JupyterLab's server extensions, terminals
    included), its interpreter links and pyvenv.cfg pointed at /usr/bin/python3, and Corral
    itself copied in (the test venv has it editable, from a source tree the sandbox would not
    see)."""
    venv = where / "ws-venv"
    subprocess.run(["cp", "-al", f"{sys.prefix}/.", f"{venv}/"], check=True, timeout=120)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for name in ("python", "python3", version):
        (venv / "bin" / name).unlink(missing_ok=True)
        (venv / "bin" / name).symlink_to(f"/usr/bin/{version}")
    (venv / "pyvenv.cfg").unlink()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    site = venv / "lib" / version / "site-packages"
    for editable in site.glob("__editable__*corral*"):
        editable.unlink()
    import corral

    shutil.copytree(Path(corral.__file__).parent, site / "corral", copy_function=os.link)
    os.chmod(where, 0o755)
    return venv


@dataclass
class World:
    server: CorralServer
    ssh_port: int
    tokens: dict[str, str]
    key: Path  # alice's private key (its .pub registered for her)
    state_dir: Path  # CORRAL_SLURM_STATE_DIR

    def client(self, user: str) -> httpx.Client:
        return self.server.client(self.tokens[user], timeout=30)


@pytest.fixture(scope="module")
def world(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    for binary in ("ssh", "ssh-keygen", SYSTEM_PYTHON):
        require_binary(binary)
    cleanup_cluster(slurm_cluster)
    shared = slurm_cluster.new_state_dir()
    ssh_port = free_port()
    tmp = tmp_path_factory.mktemp("slurm-ws")
    server = start_server(
        tmp / "home",
        extra_env={
            **server_env(slurm_cluster, shared / "state", shared / "storage"),
            "CORRAL_SSH_GATEWAY_PORT": str(ssh_port),
            "CORRAL_WORKSPACE_VENV": str(workspace_venv(shared)),
            # the idle test's short timeout takes effect within seconds (a workspace with no GPU
            # and one with Slurm's GPU, which nobody samples: their use alone counts)
            "CORRAL_CPU_JOBS_ON_GPU_NODES": "true",
            "CORRAL_MONITOR_IDLE_INTERVAL_S": "0.5",
            "CORRAL_MONITOR_SAMPLE_INTERVAL_S": "1",
            "CORRAL_WORKSPACE_IDLE_GRACE_S": "1",
        },
    )
    try:
        tokens: dict[str, str] = {}
        with server.client() as admin:
            quota = [{"gpu_model": "*", "guaranteed": 2}]
            assert admin.post(f"{API}/groups", json={"name": "team", "quotas": quota}).status_code == 201
            for user in ("alice", "bob"):
                body = {"name": user, "password": "pw-" * 4, "groups": ["team"]}
                assert admin.post(f"{API}/users", json=body).status_code == 201
                r = admin.post(f"{API}/tokens", json={"name": "t", "user": user})
                tokens[user] = r.json()["token"]
        key = tmp / "alice_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        with server.client(tokens["alice"]) as alice:
            r = alice.post(
                f"{API}/ssh-keys", json={"name": "laptop", "public_key": key.with_suffix(".pub").read_text()}
            )
            assert r.status_code == 201, r.text
        yield World(server, ssh_port, tokens, key, shared / "state")
    finally:
        server.stop()
        cleanup_cluster(slurm_cluster)


def kernel_round_trip(world: World, ws_id: int, kernel: str, code: str) -> str:
    """Run `code` in the kernel over its WebSocket through the proxy; its stdout."""
    return run_in_kernel(world.server.url, ws_id, kernel, code, world.tokens["alice"], timeout_s=60)


def wait_jupyter(alice: httpx.Client, ws_id: int, job_id: int) -> None:
    def answers() -> bool:
        job = alice.get(f"{API}/jobs/{job_id}").json()
        assert job["state"] not in ("failed", "cancelled", "succeeded"), job
        return alice.get(f"/ws/{ws_id}/api/status").status_code == 200

    wait_for(answers, 120, interval_s=0.5, what="JupyterLab on Slurm through the proxy")


def ssh(world: World, command: str) -> subprocess.CompletedProcess[str]:
    login = ["ssh", "-p", str(world.ssh_port), "-i", str(world.key), *SSH_OPTS, "alice+nb@127.0.0.1"]
    return subprocess.run([*login, command], capture_output=True, text=True, timeout=60)


def terminal_round_trip(world: World, ws_id: int, name: str, line: str, until: str) -> str:
    """Type `line` into a JupyterLab terminal over its WebSocket through the proxy; what it printed
    up to `until`."""
    srv = world.server
    url = f"ws://127.0.0.1:{srv.port}/ws/{ws_id}/terminals/websocket/{name}"
    headers = {"Authorization": f"Bearer {world.tokens['alice']}", "Origin": srv.url}
    seen = ""
    with connect(url, additional_headers=headers, open_timeout=20) as ws:
        ws.send(json.dumps(["stdin", line + "\r"]))
        while until not in seen:
            kind, *data = json.loads(ws.recv(timeout=30))
            if kind == "stdout":
                seen += str(data[0])
    return seen


def assert_activity_read(world: World, cluster: SlurmCluster, job_id: int) -> None:
    """The idle policy's reader (what the server's idle loop calls) reaches the kernel on the
    node over TCP: the workspace's last activity is the kernel run just now."""
    db = make_engine(f"sqlite:///{world.server.home / 'corral.db'}")
    engine = slurm_engine(cluster, state_dir=world.state_dir)
    try:
        seen = last_activity(make_session_factory(db), engine, [job_id])
    finally:
        engine.close()
        db.dispose()
    assert job_id in seen and time.time() - seen[job_id] < 120, seen


def test_workspace_on_slurm_through_the_proxy_and_the_gateway(
    world: World, slurm_cluster: SlurmCluster
) -> None:
    uid = pwd.getpwnam(TEST_ACCOUNTS["alice"]).pw_uid
    with world.client("alice") as alice, world.client("bob") as bob:
        created = time.monotonic()
        r = alice.post(f"{API}/workspaces", json={"name": "nb", "gpus": 1, "cpus": 1, "memory": "1GiB"})
        assert r.status_code == 201, r.text
        ws_id, job_id = r.json()["id"], r.json()["job_id"]
        status = f"/ws/{ws_id}/api/status"
        wait_jupyter(alice, ws_id, job_id)
        print(f"create -> JupyterLab on Slurm answers through the proxy: {time.monotonic() - created:.1f} s")
        job = alice.get(f"{API}/jobs/{job_id}").json()
        (node,) = {p["node"] for p in job["attempts"][-1]["placement"]}
        assert node in slurm_cluster.node_names, job

        anonymous = httpx.get(world.server.url + status, follow_redirects=False)
        assert anonymous.status_code == 302 and anonymous.headers["location"].startswith("/login"), anonymous
        other = bob.get(status)
        assert other.status_code == 404 and "there is no workspace" in other.text, other.text

        # JupyterLab listens on the node's address (NodeAddr 127.0.0.1 here) on the port it
        # reported; straight there, without Corral's credential, it lets nobody in.
        attempt_dir = world.state_dir / "attempts" / f"{job_id}.{job['attempts'][-1]['number']}"
        work = attempt_dir / "job" / "work" / "0"
        port = int((work / "jupyter.endpoint").read_text())
        assert not (work / "jupyter.sock").exists()
        direct = httpx.get(f"http://127.0.0.1:{port}{status}", timeout=10)
        assert direct.status_code == 403, direct.text

        r = alice.post(f"/ws/{ws_id}/api/kernels", json={"name": "python3"})
        assert r.status_code == 201, r.text
        kernel = r.json()["id"]
        code = (
            "import os, socket; kept = 41; print('UID', os.getuid()); print('HOST', socket.gethostname()); "
            "print('GPUS', os.environ['CUDA_VISIBLE_DEVICES'], "
            "len([d for d in os.listdir('/dev') if d.startswith('nvidia') and d[6:].isdigit()]))"
        )
        out = kernel_round_trip(world, ws_id, kernel, code)
        assert out.split() == ["UID", str(uid), "HOST", node, "GPUS", "0", "1"], out

        r = alice.post(f"/ws/{ws_id}/api/terminals")
        assert r.status_code == 200, r.text
        line = "echo T-$(id -u)-$(hostname)-$((6*7))"  # "42" is not in the echoed input
        typed = terminal_round_trip(world, ws_id, r.json()["name"], line, "-42")
        assert f"T-{uid}-{node}-42" in typed, typed
        assert_activity_read(world, slurm_cluster, job_id)

        inside = ssh(world, "id -u; hostname")
        assert inside.returncode == 0, inside.stderr
        assert inside.stdout.split() == [str(uid), node], inside.stdout

        # The user's training logs, read-only at /logs in the workspace: the log of a job of
        # alice's that ran after the workspace started is there, as the job wrote it.
        resources = {"gpus": 0, "cpus": 1, "memory": "256MiB"}
        command = "echo LOGGED-$((6*7))"
        spec = {
            "name": "logged",
            "tasks": {"main": {"instances": 1, "command": command, "resources": resources}},
        }
        logged = submit_spec(alice, spec)
        done = wait_state(alice, logged, ("succeeded", "failed", "cancelled"), timeout_s=90)
        assert done["state"] == "succeeded", done
        seen = ssh(
            world, f"cat /logs/{logged}/rank-0.log; touch /logs/{logged}/x 2>/dev/null || echo READONLY"
        )
        assert seen.stdout.split() == ["LOGGED-42", "READONLY"], (seen.stdout, seen.stderr)

        # A server killed and started again finds the same JupyterLab (nothing of it lives in
        # the server): the kernel kept its variable.
        world.server.kill()
        world.server.start()
        wait_jupyter(alice, ws_id, job_id)
        assert kernel_round_trip(world, ws_id, kernel, "print(kept + 1)").strip() == "42"

        r = alice.post(f"{API}/workspaces/nb/stop")
        assert r.status_code == 200, r.text
        stopped = lambda: alice.get(f"{API}/workspaces/nb").json()["state"] == "stopped"  # noqa: E731
        wait_for(stopped, 60, interval_s=0.3, what="the workspace to stop")
        # within the proxy's 2 s decision cache a request may still go to the ended JupyterLab (502)
        gone = wait_for(lambda: (g := alice.get(status)).status_code == 503 and g, 5, what="503")
        assert "workspace 'nb' is stopped; start it with `corral ws start nb`" in gone.text, gone.text
    refused = ssh(world, "true")
    assert refused.returncode == 1 and "workspace 'nb' is stopped" in refused.stderr, refused.stderr


@pytest.mark.parametrize("gpus", [0, 1])
def test_idle_workspace_on_slurm_is_stopped(world: World, gpus: int) -> None:
    """The idle policy stops a Slurm workspace nobody uses (no kernel, no terminal, no SSH), as on
    the local engine, with or without a GPU: nobody samples a Slurm node's GPU, so its use alone
    counts; its Slurm job ends (the main test shows the activity reader reaching a Slurm
    JupyterLab)."""
    with world.client("alice") as alice:
        body = {"name": "idle", "gpus": gpus, "cpus": 1, "memory": "1GiB", "idle_timeout": "2s"}
        r = alice.post(f"{API}/workspaces", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        cancelled = lambda: alice.get(f"{API}/jobs/{job_id}").json()["state"] == "cancelled"  # noqa: E731
        wait_for(cancelled, 60, interval_s=0.3, what="the idle stop")
        events = alice.get(f"{API}/jobs/{job_id}/events").json()
        assert any(e["kind"] == "idle_gpu" and "stopped" in e["message"] for e in events), events
        ws = alice.get(f"{API}/workspaces/idle").json()
        assert ws["state"] == "stopped"
        assert (ws["reclaimed_gpu_hours"] > 0) == bool(gpus), ws  # it held Slurm's GPU idle
        assert alice.delete(f"{API}/workspaces/idle").status_code == 204


def test_a_python_the_job_account_cannot_read_is_refused_by_name(world: World) -> None:
    """CORRAL_WORKSPACE_VENV below a dir closed to other users: the workspace's start fails at
    launch, its attempt saying which dir and what to set; nothing reaches Slurm."""
    closed = world.state_dir.parent / "private"
    (closed / "venv" / "bin").mkdir(parents=True)
    os.chmod(closed, 0o700)
    (closed / "venv" / "bin" / "python").symlink_to(SYSTEM_PYTHON)
    (closed / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    world.server.kill()
    world.server.env["CORRAL_WORKSPACE_VENV"] = str(closed / "venv")
    world.server.start()
    with world.client("alice") as alice:
        r = alice.post(f"{API}/workspaces", json={"name": "closed", "gpus": 1, "memory": "1GiB"})
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]

        def first_attempt_ended() -> dict[str, Any] | None:
            attempts = alice.get(f"{API}/jobs/{job_id}").json()["attempts"]
            return attempts[0] if attempts and attempts[0]["ended_at"] else None

        attempt = wait_for(first_attempt_ended, 60, interval_s=0.3, what="the launch to be refused")
        assert attempt["reason"] == "launch_failed", attempt
        assert f"({closed} is not open to other users)" in attempt["message"], attempt
        assert "set CORRAL_WORKSPACE_VENV" in attempt["message"], attempt
        assert not (world.state_dir / "attempts" / f"{job_id}.1" / "job").exists()
        assert alice.delete(f"{API}/workspaces/closed").status_code == 204
