"""Secrets for jobs end to end on a real server and the local engine (sandboxed in CI): a job gets
its env and file secrets (it writes their hashes, compared here), the file is read-only, 0400 and
the job's own uid's under /run/secrets, and gone when the attempt ends; another user's job naming
the secret is refused at submit; the value is nowhere in the API, `corral show`, the events, the
server's log or any file under the server's home (database and its WAL, spec.marshal, logs)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.server_fixture import CorralServer, corral_server, submit_spec, wait_state

__all__ = ["corral_server"]  # the fixture

API = "/api/v1"
ENV_VALUE = "wandb-Value $HOME 'q' \\n-4c1d"  # shell-special characters: passed as they are
FILE_VALUE = b"-----BEGIN TEST KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA9e2\n-----END TEST KEY-----\n"
GROUP_VALUE = "hub-token-91be77"
JOB_SCRIPT = (
    'printf %s "$WANDB_API_KEY" | sha256sum; sha256sum < /run/secrets/id_rsa; '
    'printf %s "$(cat /run/secrets/hub)" | sha256sum; '
    'echo "mode=$(stat -c %a /run/secrets/id_rsa) owner=$(stat -c %u /run/secrets/id_rsa) me=$(id -u)"; '
    'echo "dir=$CORRAL_SECRETS_DIR"; '
    "if (echo x > /run/secrets/id_rsa) 2>/dev/null; then echo WRITABLE; else echo read-only; fi"
)


def sha(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def user_client(srv: CorralServer, admin: httpx.Client, name: str, group: str) -> httpx.Client:
    assert (
        admin.post(f"{API}/users", json={"name": name, "groups": [group], "default_group": group}).status_code
        == 201
    )
    token = admin.post(f"{API}/tokens", json={"name": "t", "user": name}).json()["token"]
    return srv.client(token)


def files_containing(root: Path, needles: list[bytes]) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {n[:12]!r}" for n in needles if n in data]
    return found


def test_a_job_gets_its_secrets_and_nothing_else_keeps_them(corral_server: CorralServer) -> None:
    srv = corral_server
    with srv.client() as admin:
        for group in ("vision", "nlp"):
            assert admin.post(f"{API}/groups", json={"name": group}).status_code == 201
        alice = user_client(srv, admin, "alice", "vision")
        carol = user_client(srv, admin, "carol", "nlp")
        r = admin.put(f"{API}/secrets/hub", json={"value": GROUP_VALUE}, params={"group": "vision"})
        assert r.status_code == 201, r.text
    with alice, carol:
        assert alice.put(f"{API}/secrets/wandb", json={"value": ENV_VALUE}).status_code == 201
        r = alice.put(f"{API}/secrets/ssh_key", json={"value": FILE_VALUE.decode()})
        assert r.status_code == 201
        uses = [
            {"name": "wandb", "env": "WANDB_API_KEY"},
            {"name": "ssh_key", "file": "id_rsa"},
            {"name": "hub", "file": "hub"},  # vision's group secret
        ]
        spec = {
            "name": "uses-secrets",
            "command": JOB_SCRIPT,
            "resources": {"memory": "256MiB"},
            "secrets": uses,
        }
        job_id = submit_spec(alice, spec)
        job = wait_state(alice, job_id, ("succeeded", "failed"), timeout_s=60)
        log = alice.get(f"{API}/jobs/{job_id}/logs").json()["data"]
        assert job["state"] == "succeeded", (job["attempts"], log)
        lines = log.splitlines()
        assert lines[0].split()[0] == sha(ENV_VALUE.encode())
        assert lines[1].split()[0] == sha(FILE_VALUE)
        assert lines[2].split()[0] == sha(GROUP_VALUE.encode())
        mode, owner, me = (part.split("=")[1] for part in lines[3].split())
        assert mode == "400" and owner == me and me != "0"  # the job's own uid, not root's
        assert lines[4] == "dir=/run/secrets" and lines[5] == "read-only"

        # carol (nlp) names alice's secret and vision's: refused at submit, naming it
        for name in ("wandb", "hub"):
            r = carol.post(f"{API}/jobs", json={**spec, "secrets": [{"name": name, "env": "X"}]})
            assert r.status_code == 422 and f"secret {name!r}" in r.text, r.text

        # nothing Corral shows or keeps holds a value: the API, events, `corral show`, the log
        shown = [
            alice.get(f"{API}/jobs/{job_id}").text,
            alice.get(f"{API}/jobs/{job_id}/events").text,
            alice.get(f"{API}/secrets").text,
            srv.client().get(f"{API}/jobs", params={"limit": 100}).text,
        ]
    cli = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "show", str(job_id), "-o", "json"],
        env={**os.environ, "CORRAL_URL": srv.url, "CORRAL_TOKEN": srv.token},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cli.returncode == 0 and "uses-secrets" in cli.stdout, cli.stderr
    shown += [cli.stdout, srv.log_text()]
    for value in (ENV_VALUE, FILE_VALUE.decode(), GROUP_VALUE):
        assert not [text for text in shown if value in text or value.strip() in text]
    # every file under the server's home: the database (and its WAL), spec.marshal, logs, state
    needles = [ENV_VALUE.encode(), FILE_VALUE.strip(), GROUP_VALUE.encode()]
    assert files_containing(srv.home, needles) == []
    assert list(srv.home.glob("engine/attempts/*/secrets")) == []  # removed when the attempt ended
    assert list(srv.home.glob("engine/attempts/*/rank-0.log"))  # (the attempt dir itself is there)
