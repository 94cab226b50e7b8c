"""A workspace on the Slurm engine, end to end: a REAL Corral server (`CORRAL_ENGINE=slurm`) over
the session's REAL Slurm cluster. The workspace is a Slurm job running JupyterLab on its node,
as the user's mapped Unix account inside the node's bubblewrap sandbox, listening on the node's
address; the server reaches it over that address:

- through the proxy: /ws/<id>/api/status answers the owner (200), redirects nobody to the login
  (302) and answers another user as for a missing workspace (404); a kernel started through
  the proxy runs code over its WebSocket (one round trip) and reports the account's uid and the
  Slurm node's hostname, and so does a JupyterLab terminal;
- straight to the node's port, without Corral's credential, JupyterLab refuses (403); it speaks
  TLS only, with the certificate whose SHA-256 the job reported beside the port;
- another process holding the port the job reported (plain HTTP, or TLS with another
  certificate) gets no request and no credential, and the owner a 502 saying why, for HTTP and
  for a WebSocket; the owner's JupyterLab answers again once the port is its own;
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

import contextlib
import json
import os
import pwd
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from corral.db.session import make_engine, make_session_factory
from corral.workspaces.activity import last_activity
from corral.workspaces.endpoint import parse_endpoint
from corral.workspaces.labtls import fingerprint_of_pem, make_certificate
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


def attempt_work_dir(world: World, job: dict[str, Any]) -> Path:
    """The rank-0 work dir of the job's latest attempt: where its JupyterLab's endpoint file is."""
    attempt = f"{job['id']}.{job['attempts'][-1]['number']}"
    return world.state_dir / "attempts" / attempt / "job" / "work" / "0"


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
        # reported, with TLS under the certificate it reported; straight there, without Corral's
        # credential, it lets nobody in.
        work = attempt_work_dir(world, job)
        port, fingerprint = parse_endpoint((work / "jupyter.endpoint").read_bytes())
        assert not (work / "jupyter.sock").exists()
        assert fingerprint_of_pem(ssl.get_server_certificate(("127.0.0.1", port), timeout=10)) == fingerprint
        direct = httpx.get(f"https://127.0.0.1:{port}{status}", timeout=10, verify=False)
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


class Squatter:
    """Another process on the node holding a port: it keeps every byte it is sent (after TLS,
    when it has TLS) and answers anything with a 200 page of its own (which the proxy would
    serve on the portal's origin)."""

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        self.tls = tls
        self.received: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = int(self.listener.getsockname()[1])
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(15)
            stream = conn if self.tls is None else self.tls.wrap_socket(conn, server_side=True)
            while data := stream.recv(65536):
                self.received.append(data)
                stream.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nsquatted")

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.listener.close()


def replace_endpoint_port(endpoint: Path, uid: int, old: int, new: int) -> None:
    """The job's endpoint file naming `new` where it named `old`, the rest as the launcher wrote
    it, still the job's own file: the state a workspace is in when another process holds its
    lab's port (the launcher's window before JupyterLab binds; JupyterLab gone, its job not)."""
    text = endpoint.read_text()
    assert text.startswith(f"{old}"), text
    tmp = endpoint.with_name(".squat.tmp")
    tmp.write_text(text.replace(f"{old}", f"{new}", 1))
    os.chown(tmp, uid, uid)
    os.replace(tmp, endpoint)


def test_a_process_holding_the_labs_port_gets_nothing_of_the_owners(world: World) -> None:
    """The proxy (HTTP and WebSocket) sends nothing to a process that is not the owner's
    JupyterLab: before the pin, it sent the owner's requests and the workspace's token to
    whatever listened on the port the job reported, and served its answers."""
    uid = pwd.getpwnam(TEST_ACCOUNTS["alice"]).pw_uid
    db = make_engine(f"sqlite:///{world.server.home / 'corral.db'}")
    squatters: list[Squatter] = []
    with world.client("alice") as alice:
        r = alice.post(f"{API}/workspaces", json={"name": "squat", "gpus": 0, "cpus": 1, "memory": "1GiB"})
        assert r.status_code == 201, r.text
        ws_id, job_id = r.json()["id"], r.json()["job_id"]
        status = f"/ws/{ws_id}/api/status"
        try:
            wait_jupyter(alice, ws_id, job_id)
            endpoint = attempt_work_dir(world, alice.get(f"{API}/jobs/{job_id}").json()) / "jupyter.endpoint"
            lab_port = int(endpoint.read_text().split()[0])
            with db.connect() as conn:
                token = conn.exec_driver_sql(
                    f"SELECT jupyter_token FROM workspaces WHERE id = {ws_id}"
                ).scalar()
            assert isinstance(token, str) and len(token) >= 16, token
            where = world.state_dir.parent / "squatter-tls"
            where.mkdir(exist_ok=True)
            cert, key, _ = make_certificate(str(where))
            other_certificate = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            other_certificate.load_cert_chain(cert, key)
            headers = {"Authorization": f"Bearer {world.tokens['alice']}", "Origin": world.server.url}
            ws_url = f"ws://127.0.0.1:{world.server.port}/ws/{ws_id}/api/events/subscribe"
            for tls in (None, other_certificate):
                squatter = Squatter(tls)
                squatters.append(squatter)
                replace_endpoint_port(endpoint, uid, lab_port, squatter.port)
                # (the proxy's decision, and the port in it, is cached for up to 2 s)
                refused = wait_for(
                    lambda: (g := alice.get(status)).status_code != 200 and g, 10, what="refusal"
                )
                assert refused.status_code == 502, refused.text
                detail = refused.json()["detail"]
                assert (
                    f"127.0.0.1:{squatter.port} did not prove to be the workspace's JupyterLab" in detail
                ), detail
                assert detail.endswith("nothing was sent to it"), detail
                with pytest.raises(InvalidStatus) as denied, connect(ws_url, additional_headers=headers):
                    pass
                assert denied.value.response.status_code == 502, denied.value.response
                assert b"did not prove to be it" in denied.value.response.body, denied.value.response
                replace_endpoint_port(endpoint, uid, squatter.port, lab_port)
                wait_for(lambda: alice.get(status).status_code == 200, 10, what="the lab again")
            time.sleep(0.5)  # the squatters' last reads
            plain, other = (b"".join(s.received) for s in squatters)
            assert other == b"", other  # TLS done with its own certificate; no request byte followed
            assert all(chunk.startswith(b"\x16\x03") for chunk in squatters[0].received), plain  # hellos
            for data in (plain, other):
                assert token.encode() not in data, data
                # (a ClientHello may name "http/1.1", as its ALPN; a request line ends " HTTP/1.1\r\n")
                for leak in (b"x-corral-workspace-token", b"/ws/", b" http/1.1\r\n", b"upgrade:"):
                    assert leak not in data.lower(), (leak, data)
        finally:
            for squatter in squatters:
                squatter.close()
            db.dispose()
            assert alice.post(f"{API}/workspaces/squat/stop").status_code == 200
            stopped = lambda: alice.get(f"{API}/workspaces/squat").json()["state"] == "stopped"  # noqa: E731
            wait_for(stopped, 60, interval_s=0.3, what="the workspace to stop")
            assert alice.delete(f"{API}/workspaces/squat").status_code == 204


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
