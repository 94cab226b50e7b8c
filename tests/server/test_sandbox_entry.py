"""Entering a running job from outside, end to end on a real server (local engine, bubblewrap,
cgroups, the job's own network namespace): `corral exec`, `corral port-forward`, and the SSH
gateway driven by Debian's OpenSSH client (ssh, scp, -L) and by asyncssh (SFTP). Whatever comes
back is compared with what the job itself printed about its uid, cgroup and GPUs at start."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import httpx
import pytest

from tests.server_fixture import CorralServer, start_server, wait_for
from tests.server_harness import free_port
from tests.support import require_binary

pytestmark = pytest.mark.isolation
HTTP_PORT = 8765
# The job reports who and where it is, then serves a page on its own loopback.
JOB_COMMAND = (
    "echo UID=$(id -u); echo CG=$(grep :memory: /proc/self/cgroup); echo GPUS=$CUDA_VISIBLE_DEVICES; "
    "mkdir -p /tmp/www && echo hello-from-job > /tmp/www/index.html; echo ready; "
    f"exec python3 -m http.server {HTTP_PORT} --bind 127.0.0.1 --directory /tmp/www"
)
REPORT = "echo UID=$(id -u); echo CG=$(grep :memory: /proc/self/cgroup); echo GPUS=$CUDA_VISIBLE_DEVICES"
CLI = [sys.executable, "-m", "corral.cli.main"]
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes"]
SSH_OPTS += ["-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10"]


@dataclass
class World:
    server: CorralServer
    ssh_port: int
    tokens: dict[str, str]
    keys: dict[str, Path]  # user -> private key file (its .pub registered for that user)
    job_id: int
    report: list[str]  # the job's own UID=/CG=/GPUS= lines
    tmp: Path

    def env(self, user: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(CORRAL_URL=self.server.url, CORRAL_TOKEN=self.tokens[user], CORRAL_HOME=str(self.tmp))
        return env

    def ssh(
        self, user: str, *args: str, key: str | None = None, term: str = "dumb"
    ) -> subprocess.CompletedProcess[str]:
        """ssh with `user`'s key: args are [ssh options...] login [command...]."""
        at = next(i for i, a in enumerate(args) if "+" in a)
        opts, login, command = args[:at], args[at], args[at + 1 :]
        argv = ["ssh", "-p", str(self.ssh_port), "-i", str(self.keys[key or user]), *SSH_OPTS, *opts]
        return subprocess.run(
            [*argv, f"{login}@127.0.0.1", *command],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
            env={**os.environ, "TERM": term},
        )  # fmt: skip


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    for binary in ("bwrap", "ssh", "scp", "ssh-keygen"):
        require_binary(binary)
    tmp = tmp_path_factory.mktemp("entry")
    ssh_port = free_port()
    server = start_server(tmp / "home", extra_env={"CORRAL_SSH_GATEWAY_PORT": str(ssh_port)})
    try:
        tokens, keys = {}, {}
        with server.client() as api:
            r = api.post(
                "/api/v1/groups", json={"name": "team", "quotas": [{"gpu_model": "VGPU", "guaranteed": 2}]}
            )
            assert r.status_code == 201, r.text
            for user in ("alice", "bob"):
                r = api.post("/api/v1/users", json={"name": user, "password": "pw-" * 4, "groups": ["team"]})
                assert r.status_code == 201, r.text
                r = api.post("/api/v1/tokens", json={"name": "t", "user": user})
                assert r.status_code == 201, r.text
                tokens[user] = r.json()["token"]
                keys[user] = _keygen(tmp / f"{user}_key")
                pub = (tmp / f"{user}_key.pub").read_text()
                r = api.post(
                    "/api/v1/ssh-keys",
                    json={"name": "laptop", "public_key": pub},
                    headers={"Authorization": f"Bearer {tokens[user]}"},
                )
                assert r.status_code == 201, r.text
        with server.client(tokens["alice"]) as c:
            spec = {"name": "svc", "tasks": {"main": {"command": JOB_COMMAND, "resources": {"gpus": 2}}}}
            r = c.post("/api/v1/jobs", json=spec)
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]

            def job_ready() -> str:
                return (
                    c.get(f"/api/v1/jobs/{job_id}/logs").json()["data"]
                    if "ready" in c.get(f"/api/v1/jobs/{job_id}/logs").json()["data"]
                    else ""
                )

            log = wait_for(job_ready, timeout_s=30, what="the job to start")
        report = [line for line in log.splitlines() if line.startswith(("UID=", "CG=", "GPUS="))]
        assert len(report) == 3 and report[0] != "UID=0" and report[2] != "GPUS=", report
        yield World(server, ssh_port, tokens, keys, job_id, report, tmp)
    finally:
        server.stop()


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("UID=", "CG=", "GPUS="))]


def test_corral_exec_runs_as_the_job_in_its_cgroup_with_its_gpus(world: World) -> None:
    out = subprocess.run(
        [*CLI, "exec", str(world.job_id), "--", "sh", "-c", REPORT + "; exit 3"],
        capture_output=True, text=True, timeout=60, env=world.env("alice"), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert _lines(out.stdout) == world.report


def test_exec_is_for_the_owner_only_and_audited(world: World) -> None:
    from corral.exec_client import ExecError, ExecSession

    # bob may not see alice's job: it answers as a missing one
    with pytest.raises(ExecError, match=rf"no job with id {world.job_id}\b") as refused:
        ExecSession.open(world.server.url, world.tokens["bob"], world.job_id, {"argv": ["true"]})
    assert refused.value.status_code == 404
    with pytest.raises(ExecError, match="no job with id"):
        ExecSession.open(world.server.url, world.tokens["alice"], 999999, {"argv": ["true"]})
    with pytest.raises(ExecError, match="not authenticated"):
        ExecSession.open(world.server.url, None, world.job_id, {"argv": ["true"]})
    # An admin may enter (and is named in the audit log).
    from corral.sdk import Client

    with Client(world.server.url, world.server.token) as admin:
        result = admin.exec(world.job_id, ["cat"], stdin=b"piped through")
        assert (result.exit_code, result.stdout) == (0, b"piped through")
        rows = admin.request("GET", "/audit", params={"action": "job.exec"})
    actors = {row["actor"] for row in rows["items"]} if isinstance(rows, dict) else {r["actor"] for r in rows}
    assert {"admin", "alice"} <= actors, rows


def test_exec_with_a_terminal(world: World) -> None:
    from corral.exec_client import run_collect
    from corral.sdk import Client

    with Client(world.server.url, world.tokens["alice"]) as c:
        probe = ["sh", "-c", "test -t 0 && stty size"]
        session = c.exec_session(world.job_id, probe, tty=True, rows=33, cols=101)
        with session:
            result = run_collect(session)
    assert result.exit_code == 0 and result.stdout.split() == [b"33", b"101"], result


def test_port_forward_reaches_a_server_on_the_jobs_loopback(world: World) -> None:
    proc = subprocess.Popen(
        [*CLI, "port-forward", str(world.job_id), f"0:{HTTP_PORT}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=world.env("alice"),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"Forwarding 127\.0\.0\.1:(\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        for _ in range(2):  # two connections, each its own relay
            r = httpx.get(f"http://127.0.0.1:{m.group(1)}/index.html", timeout=20)
            assert r.text.strip() == "hello-from-job"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_port_forward_refused_is_one_line_not_a_traceback(world: World) -> None:
    # Refused before listening (another user's job, or one not running): it was an ExecError
    # traceback, where `corral exec` says one line.
    out = subprocess.run(
        [*CLI, "port-forward", str(world.job_id), f"0:{HTTP_PORT}"],
        capture_output=True, text=True, timeout=60, env=world.env("bob"), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"error: no job with id {world.job_id}" in out.stderr, out.stderr


def test_ssh_command_runs_inside_the_sandbox(world: World) -> None:
    out = world.ssh("alice", f"alice+job-{world.job_id}", REPORT)
    assert out.returncode == 0, out.stderr
    assert _lines(out.stdout) == world.report
    assert world.ssh("alice", f"alice+job-{world.job_id}", "exit 5").returncode == 5
    # With a PTY (-tt): a terminal of the given type, still the job's uid.
    probe = 'test -t 0 && echo TTY=yes; echo "T=$TERM"; id -u'
    tty = world.ssh("alice", "-tt", f"alice+job-{world.job_id}", probe, term="vt220")
    assert tty.returncode == 0, tty.stderr
    assert tty.stdout.replace("\r", "").split() == [
        "TTY=yes",
        "T=vt220",
        world.report[0].removeprefix("UID="),
    ]


def test_ssh_refuses_other_keys_passwords_and_unknown_targets(world: World) -> None:
    other = world.ssh("bob", f"alice+job-{world.job_id}", "true")
    assert other.returncode == 255 and "Permission denied (publickey)" in other.stderr, other.stderr
    # Bob's own key for bob: authenticated, but alice's job is not his.
    theirs = world.ssh("bob", f"bob+job-{world.job_id}", "true")
    assert theirs.returncode == 1 and f"no job with id {world.job_id}" in theirs.stderr, theirs.stderr
    no_key = ["-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,keyboard-interactive"]
    login = f"alice+job-{world.job_id}@127.0.0.1"
    password = subprocess.run(
        ["ssh", "-p", str(world.ssh_port), *SSH_OPTS, *no_key, login, "true"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert password.returncode == 255 and "Permission denied (publickey)" in password.stderr, password.stderr
    workspace = world.ssh("alice", "alice+notebook", "true")
    assert workspace.returncode == 1 and "unknown workspace 'notebook'" in workspace.stderr, workspace.stderr


def test_scp_both_ways(world: World) -> None:
    src = world.tmp / "up.bin"
    src.write_bytes(os.urandom(3 << 20))
    scp = ["scp", "-P", str(world.ssh_port), "-i", str(world.keys["alice"]), *SSH_OPTS]
    target = f"alice+job-{world.job_id}@127.0.0.1"
    up = subprocess.run([*scp, str(src), f"{target}:/tmp/up.bin"], capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    inside = world.ssh("alice", f"alice+job-{world.job_id}", "sha256sum /tmp/up.bin; stat -c %u /tmp/up.bin")
    digest, owner = inside.stdout.split()[0], inside.stdout.split()[-1]
    assert digest == hashlib.sha256(src.read_bytes()).hexdigest()
    assert f"UID={owner}" == world.report[0]  # written by the job's own uid
    back = world.tmp / "down.bin"
    down = subprocess.run(
        [*scp, f"{target}:/tmp/up.bin", str(back)], capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 0, down.stderr
    assert back.read_bytes() == src.read_bytes()


def test_ssh_local_forward_lands_in_the_jobs_network(world: World) -> None:
    local = free_port()
    argv = ["ssh", "-p", str(world.ssh_port), "-i", str(world.keys["alice"]), *SSH_OPTS, "-N"]
    argv += ["-o", "ExitOnForwardFailure=yes", "-L", f"{local}:localhost:{HTTP_PORT}"]
    proc = subprocess.Popen([*argv, f"alice+job-{world.job_id}@127.0.0.1"], stderr=subprocess.PIPE)
    try:

        def fetch() -> str:
            try:
                return httpx.get(f"http://127.0.0.1:{local}/index.html", timeout=10).text
            except httpx.HTTPError:
                return ""

        assert wait_for(fetch, timeout_s=20, what="the forwarded page").strip() == "hello-from-job"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_sftp_with_asyncssh(world: World) -> None:
    async def session() -> tuple[list[str], bytes]:
        conn = await asyncssh.connect(
            "127.0.0.1", world.ssh_port, username=f"alice+job-{world.job_id}",
            client_keys=[str(world.keys["alice"])], known_hosts=None,
        )  # fmt: skip
        async with conn, conn.start_sftp_client() as sftp:
            async with sftp.open("/tmp/www/sftp.txt", "wb") as f:
                await f.write(b"via sftp")
            names = sorted(await sftp.listdir("/tmp/www"))
            async with sftp.open("/tmp/www/index.html", "rb") as f:
                return names, await f.read()

    names, page = asyncio.run(session())
    assert "sftp.txt" in names and page.strip() == b"hello-from-job"
    assert world.ssh("alice", f"alice+job-{world.job_id}", "cat /tmp/www/sftp.txt").stdout == "via sftp"


def test_key_registration_errors_are_clear(world: World) -> None:
    pub = (world.tmp / "alice_key.pub").read_text()
    alice = {"Authorization": f"Bearer {world.tokens['alice']}"}
    bob = {"Authorization": f"Bearer {world.tokens['bob']}"}
    with world.server.client() as api:
        dup = api.post("/api/v1/ssh-keys", json={"name": "again", "public_key": pub}, headers=alice)
        assert dup.status_code == 409 and "already registered to your account" in dup.text
        # Another user may register the same public key (it opens only the logins of the users
        # who registered it: tests/api/test_gateway_login.py); nobody can squat it any more.
        shared = api.post("/api/v1/ssh-keys", json={"name": "x", "public_key": pub}, headers=bob)
        assert shared.status_code == 201, shared.text
        assert api.delete(f"/api/v1/ssh-keys/{shared.json()['id']}", headers=bob).status_code == 204
        junk = api.post("/api/v1/ssh-keys", json={"name": "x", "public_key": "hello world"}, headers=bob)
        assert junk.status_code == 422 and "public_key" in junk.text and "ssh-ed25519" in junk.text


def workspace_last_used(world: World) -> float | None:
    """`nb`'s last session use as the server persisted it (corral.services.session_use)."""
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{world.server.home / 'corral.db'}")
    try:
        with engine.connect() as db:
            return db.execute(sa.text("SELECT last_used_at FROM workspaces WHERE name = 'nb'")).scalar()
    finally:
        engine.dispose()


def test_ssh_into_a_workspace_by_its_name_and_refused_once_stopped(world: World) -> None:
    """`<user>+<workspace>` reaches the workspace's running job (corral.services.workspaces);
    a stopped workspace and bob's key for alice's workspace are refused."""
    with world.server.client(world.tokens["alice"]) as c:
        r = c.post("/api/v1/workspaces", json={"name": "nb", "cpus": 0.5, "memory": "1GiB"})
        assert r.status_code == 201, r.text

        def running() -> bool:
            return c.get("/api/v1/workspaces/nb").json()["state"] == "running"

        wait_for(running, timeout_s=60, what="the workspace to run")
        assert workspace_last_used(world) is None  # no session yet
        before = time.time()
        inside = world.ssh("alice", "alice+nb", "id -u")
        assert inside.returncode == 0, inside.stderr
        assert inside.stdout.split()[0] == world.report[0].removeprefix("UID="), inside.stdout
        # The short command's close is the workspace's last use (idle reclamation), persisted
        after_ssh = wait_for(lambda: workspace_last_used(world), timeout_s=10, what="the SSH use")
        assert before <= after_ssh <= time.time(), after_ssh
        job_id = c.get("/api/v1/workspaces/nb").json()["job_id"]
        from corral.sdk import Client

        with Client(world.server.url, world.tokens["alice"]) as alice:
            assert alice.exec(job_id, ["true"]).exit_code == 0  # `corral exec` counts as use too
        wait_for(lambda: (workspace_last_used(world) or 0) > after_ssh, timeout_s=10, what="the exec use")
        assert world.ssh("bob", "alice+nb", "true").returncode == 255
        r = c.post("/api/v1/workspaces/nb/stop")
        assert r.status_code == 200, r.text
        stopped_state = lambda: c.get("/api/v1/workspaces/nb").json()["state"] == "stopped"  # noqa: E731
        wait_for(stopped_state, timeout_s=60, what="the workspace to stop")
    stopped = world.ssh("alice", "alice+nb", "true")
    assert stopped.returncode == 1 and "workspace 'nb' is stopped" in stopped.stderr, stopped.stderr


def test_ssh_and_scp_into_a_workspace_start_in_the_home_and_what_they_write_outlives_a_stop(
    world: World,
) -> None:
    """As under sshd, a shell, a command and scp's relative paths start in the user's home, not
    in the job's working dir (/job, the attempt's own, gone at each stop): `scp notes.txt
    alice+lab:` then `corral ws stop lab` and `start lab` finds notes.txt again."""
    src = world.tmp / "notes.txt"
    src.write_text("kept across a stop\n")
    scp = ["scp", "-P", str(world.ssh_port), "-i", str(world.keys["alice"]), *SSH_OPTS]
    with world.server.client(world.tokens["alice"]) as c:
        r = c.post("/api/v1/workspaces", json={"name": "lab", "cpus": 0.5, "memory": "1GiB"})
        assert r.status_code == 201, r.text
        state = lambda: c.get("/api/v1/workspaces/lab").json()["state"]  # noqa: E731
        wait_for(lambda: state() == "running", timeout_s=60, what="the workspace to run")
        where = world.ssh("alice", "alice+lab", "pwd; echo from-ssh > ssh-notes.txt")
        assert (where.returncode, where.stdout.split()) == (0, ["/home/alice"]), where.stderr
        shell = world.ssh("alice", "-tt", "alice+lab", "pwd")  # a command with a terminal
        assert shell.stdout.replace("\r", "").split() == ["/home/alice"], shell.stderr
        to_home = [*scp, str(src), "alice+lab@127.0.0.1:"]
        up = subprocess.run(to_home, capture_output=True, text=True, timeout=60)
        assert up.returncode == 0, up.stderr
        assert c.post("/api/v1/workspaces/lab/stop").status_code == 200
        wait_for(lambda: state() == "stopped", timeout_s=60, what="the workspace to stop")
        assert c.post("/api/v1/workspaces/lab/start").status_code == 200
        wait_for(lambda: state() == "running", timeout_s=60, what="the workspace to run again")
        again = world.ssh("alice", "alice+lab", "cat /home/alice/notes.txt ssh-notes.txt")
        assert (again.returncode, again.stdout) == (0, "kept across a stop\nfrom-ssh\n"), again.stderr
        assert c.delete("/api/v1/workspaces/lab").status_code in (200, 204)


def test_revoking_a_credential_ends_the_sessions_it_holds_open(world: World) -> None:
    """An exec WebSocket ends within seconds of its token's revoke, and an SSH connection within
    seconds of the removal of the key it logged in with; neither is ended by the other's change."""
    from corral.exec_client import ExecError, ExecSession

    key = _keygen(world.tmp / "alice_key2")
    admin = world.server.client()
    r = admin.post("/api/v1/tokens", json={"name": "exec", "user": "alice"})
    assert r.status_code == 201, r.text
    token, token_id = r.json()["token"], r.json()["id"]
    pub = (world.tmp / "alice_key2.pub").read_text()
    r = admin.post(
        "/api/v1/ssh-keys",
        json={"name": "second", "public_key": pub},
        headers={"Authorization": f"Bearer {world.tokens['alice']}"},
    )
    assert r.status_code == 201, r.text
    key_id = r.json()["id"]

    async def scenario() -> tuple[float, float, BaseException | None]:
        conn = await asyncssh.connect(
            "127.0.0.1", world.ssh_port, username=f"alice+job-{world.job_id}",
            client_keys=[str(key)], known_hosts=None,
        )  # fmt: skip
        ssh_proc = await conn.create_process("sleep 60")
        session = await asyncio.to_thread(
            ExecSession.open, world.server.url, token, world.job_id, {"argv": ["sleep", "60"]}
        )

        def exec_outcome() -> BaseException | None:
            try:
                session.recv()
            except ExecError as exc:
                return exc
            return None

        outcome = asyncio.ensure_future(asyncio.to_thread(exec_outcome))
        revoked = time.monotonic()
        assert (await asyncio.to_thread(admin.delete, f"/api/v1/tokens/{token_id}")).status_code == 204
        error = await asyncio.wait_for(outcome, 10)
        exec_s = time.monotonic() - revoked
        await asyncio.sleep(3)  # the SSH connection, held by a key still registered, lives on
        assert not conn.is_closed() and ssh_proc.exit_status is None
        removed = time.monotonic()
        assert (await asyncio.to_thread(admin.delete, f"/api/v1/ssh-keys/{key_id}")).status_code == 204
        await asyncio.wait_for(conn.wait_closed(), 10)
        return exec_s, time.monotonic() - removed, error

    try:
        exec_s, ssh_s, error = asyncio.run(scenario())
    finally:
        admin.close()
    assert isinstance(error, ExecError) and error.status_code == 401 and "revoked" in error.message, error
    assert exec_s < 3 and ssh_s < 3, (exec_s, ssh_s)
