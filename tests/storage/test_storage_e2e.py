"""Storage end to end on a real server (local engine, bubblewrap, cgroups): group dirs shared by
members only (symlink and hard-link tricks included), private homes that persist, stable uids,
`--code` snapshots run from /code with a checkpoint to /outputs, and `corral job outputs --pull`."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.sdk import ApiError, Client
from tests.server_fixture import CorralServer, start_server

pytestmark = pytest.mark.isolation
USERS = {"alice": ["vision", "nlp"], "bob": ["vision"], "carol": ["nlp"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    srv = start_server(tmp_path_factory.mktemp("storage") / "home", allow_unisolated=False)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def clients(server: CorralServer) -> Iterator[dict[str, Client]]:
    admin = Client(server.url, server.token)
    for group in ("vision", "nlp"):
        admin.create_group(group)
    made = {}
    for user, groups in USERS.items():
        admin.create_user(user, groups=groups, default_group=groups[0])
        token = admin.create_token(f"{user}-t", user=user)["token"]
        made[user] = Client(server.url, token)
    made["admin"] = admin
    yield made
    for c in made.values():
        c.close()


def run_job(c: Client, command: str, **spec: Any) -> tuple[dict[str, Any], str]:
    job = c.submit(
        {"name": "st", "command": command, "resources": {"cpus": 0.25, "memory": "128MiB"}, **spec}
    )
    job = c.wait(job["id"], timeout_s=60)
    return job, c.logs(job["id"])["data"]


def storage_root(server: CorralServer) -> Path:
    return server.home / "storage"


def test_group_dir_is_shared_by_members_and_closed_to_others(
    server: CorralServer, clients: dict[str, Client]
) -> None:
    alice, bob, carol = clients["alice"], clients["bob"], clients["carol"]
    job, log = run_job(
        alice,
        "echo secret-v > /group/vision/x && mkdir -p /group/vision/alice/ck && "
        "ln -s /group/vision/x /group/nlp/soft; ln /group/vision/x /group/nlp/inside-hard; echo ln=$?",
    )
    assert job["state"] == "succeeded", log
    assert "ln=0" not in log  # a hard link across the two binds fails in the job (EXDEV)
    root = storage_root(server)
    x = root / "group" / "vision" / "x"
    st = os.stat(x)
    assert stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)  # umask 007 in jobs
    assert st.st_gid == os.stat(root / "group" / "vision").st_gid  # setgid: the group's gid
    assert stat.S_IMODE(os.stat(root / "group" / "vision").st_mode) == 0o2770
    # A member with a shell on the host plants a hard link where carol can reach it.
    os.link(x, root / "group" / "nlp" / "hard")

    job, log = run_job(bob, "cat /group/vision/x && echo bob > /group/vision/bob/note && ls /group")
    assert job["state"] == "succeeded", log
    assert "secret-v" in log and "nlp" not in log.split("secret-v", 1)[1]  # bob sees only vision

    job, log = run_job(
        carol,
        "cat /group/nlp/soft; echo soft=$?; cat /group/nlp/hard; echo hard=$?; "
        "test -e /group/vision && echo VISION-VISIBLE; ls /group",
    )
    assert job["state"] == "succeeded", log
    assert "secret-v" not in log
    assert re.search(r"soft=[1-9]", log) and re.search(r"hard=[1-9]", log), log
    assert "Permission denied" in log  # the hard link leads to a 0660 inode of vision's gid
    assert "VISION-VISIBLE" not in log

    with pytest.raises(ApiError) as refused:
        carol.submit({"name": "m", "command": "true", "mounts": [{"source": "group/vision"}]})
    assert refused.value.status_code == 403 and "vision" in refused.value.message


def test_spec_mounts_modes_and_bad_sources(clients: dict[str, Client]) -> None:
    alice = clients["alice"]
    job, log = run_job(
        alice,
        "cat /mnt/ck/../x 2>/dev/null; ls /mnt/ck && touch /mnt/ck/new; echo touch=$?; "
        "touch /mnt/rw/ok && echo rw-ok",
        mounts=[
            {"source": "group/vision/alice", "target": "/mnt/ck"},
            {"source": "group/vision/alice/ck", "target": "/mnt/rw", "mode": "rw"},
        ],
    )
    assert job["state"] == "succeeded", log
    assert "ck" in log and re.search(r"touch=[1-9]", log) and "rw-ok" in log
    bad = {
        "group/vision/../nlp": "component",
        "group/vi\x00sion": "'source' holds a NUL character",  # refused by the spec itself (read_spec)
        "group/vi\x01sion": "not a valid name",
        "nosuch/thing": "unknown source",
        "home/other": "takes no path",
    }
    for source, words in bad.items():
        with pytest.raises(ApiError) as refused:
            alice.submit({"name": "m", "command": "true", "mounts": [{"source": source}]})
        assert refused.value.status_code == 422 and words in refused.value.message, refused.value.message
    for target in ("/etc/passwd", "/mnt/../etc", "relative", "/outputs/x"):
        with pytest.raises(ApiError) as refused:
            alice.submit({"name": "m", "command": "true", "mounts": [{"source": "home", "target": target}]})
        assert refused.value.status_code == 422 and "target" in refused.value.message
    # A member's symlink is never followed into a bind (it would be followed as root on the host),
    # and no mount goes inside another user's place under /home or /group.
    job, log = run_job(alice, "ln -s /etc /group/vision/alice/evil && echo linked")
    assert "linked" in log, log
    for mount in ({"source": "group/vision/alice/evil"}, {"source": "home", "target": "/group/nlp/x"}):
        with pytest.raises(ApiError) as refused:
            alice.submit({"name": "m", "command": "true", "mounts": [mount]})
        assert refused.value.status_code == 422 and (
            "symlink" in refused.value.message or "/group" in refused.value.message
        )
    # A group's subdir is never a mount point inside the group's own bind, which bwrap would make
    # through a dir any member may change: read-only there is refused, read-write is the group's
    # bind itself (no mount of its own).
    with pytest.raises(ApiError) as refused:
        alice.submit({"name": "m", "command": "true", "mounts": [{"source": "group/vision/alice"}]})
    assert refused.value.status_code == 422 and "inside /group/vision" in refused.value.message
    job, log = run_job(
        alice,
        "touch /group/vision/alice/via-rw && grep -c ' /group/vision' /proc/self/mountinfo",
        mounts=[{"source": "group/vision/alice", "mode": "rw"}],
    )
    assert job["state"] == "succeeded" and log.split() == ["1"], log
    # The old form is read as the new one: group_storage: G is source group/G.
    job, log = run_job(
        alice,
        "ls /group/nlp/soft-alias 2>&1; ls /mnt/g",
        mounts=[{"group_storage": "nlp", "target": "/mnt/g"}],
    )
    assert job["state"] == "succeeded" and "soft" in log, log


def test_home_persists_is_private_and_uid_is_stable(server: CorralServer, clients: dict[str, Client]) -> None:
    alice, bob = clients["alice"], clients["bob"]
    job1, log1 = run_job(alice, 'echo kept > "$HOME/note"; id -u; id -G; pwd')
    job2, log2 = run_job(alice, 'cat /home/alice/note; id -u; echo "home=$HOME"')
    assert job1["state"] == job2["state"] == "succeeded", log1 + log2
    uid = int(log1.split()[0])
    assert 300000 <= uid <= 399999 and log2.split()[1] == str(uid)  # the same uid in every job
    assert "kept" in log2 and "home=/home/alice" in log2
    home = storage_root(server) / "home" / "alice"
    st = os.stat(home)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o700)
    vision_gid = os.stat(storage_root(server) / "group" / "vision").st_gid
    assert str(vision_gid) in log1.split()[1:4]  # supplementary gids: alice's groups
    ids = {(i["kind"], i["name"]): i["id"] for i in clients["admin"].storage_identities()}
    assert ids[("user", "alice")] == uid and ids[("group", "vision")] == vision_gid
    with pytest.raises(ApiError) as not_admin:
        bob.storage_identities()
    assert not_admin.value.status_code == 403
    _job, log = run_job(bob, "ls /home; cat /home/alice/note; echo rc=$?")
    assert "alice" not in log.replace("/home/alice/note", "") and "kept" not in log and "rc=1" in log


def corral(
    server: CorralServer, token: str, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CORRAL_URL": server.url,
        "CORRAL_TOKEN": token,
        "CORRAL_HOME": str(server.home / "cli"),
    }
    return subprocess.run(
        [sys.executable, "-m", "corral.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_code_snapshot_runs_and_outputs_are_pulled(
    server: CorralServer, clients: dict[str, Client], tmp_path: Path
) -> None:
    admin = clients["admin"]
    token = admin.create_token("code-t", user="alice")["token"]
    code = tmp_path / "proj"
    (code / "data").mkdir(parents=True)
    (code / "data" / "big.bin").write_bytes(b"x" * 100_000)
    (code / "run.log").write_text("ignored")
    (code / ".gitignore").write_text("data/\n*.log\n")
    (code / "pkg").mkdir()
    (code / "pkg" / "__init__.py").write_text("STEP = 7\n")
    (code / "train.py").write_text(
        "import os, pkg\n"
        "os.makedirs('/outputs/ckpt', exist_ok=True)\n"
        "open('/outputs/ckpt/model.bin', 'w').write(f'step={pkg.STEP} cwd={os.getcwd()}')\n"
        "print(sorted(os.listdir('.')))\n"
    )
    spec = tmp_path / "job.yaml"
    spec.write_text("name: code\ncommand: python train.py\nresources: {cpus: 0.25, memory: 256MiB}\n")
    first = corral(server, token, "submit", str(spec), "--code", str(code), "--wait", "-o", "json")
    assert first.returncode == 0, first.stderr + first.stdout
    assert re.search(r"code: 3 files, \d+ bytes; uploaded [1-9]\d* bytes", first.stderr), first.stderr
    job_id = int(re.search(r'"id": (\d+)', first.stdout).group(1))  # type: ignore[union-attr]
    log = clients["alice"].logs(job_id)["data"]
    assert "['.gitignore', 'pkg', 'train.py']" in log, log  # ignored files stay home
    again = clients["alice"].upload_code(code)  # what `submit --code` does first
    assert (again.files, again.uploaded_bytes) == (3, 0)  # unchanged: nothing is sent again
    assert [o["path"] for o in clients["alice"].job_outputs(job_id)] == ["ckpt/model.bin"]
    pulled = corral(server, token, "job", "outputs", str(job_id), "--pull", str(tmp_path / "got"))
    assert pulled.returncode == 0, pulled.stderr
    assert (tmp_path / "got" / "ckpt" / "model.bin").read_text() == "step=7 cwd=/code"

    bob_sees = clients["bob"]
    with pytest.raises(ApiError) as hidden:
        bob_sees.job_outputs(job_id)
    assert (hidden.value.status_code, hidden.value.message) == (404, f"no job with id {job_id}")
    outputs = storage_root(server) / "outputs" / str(job_id)
    assert outputs.is_dir()
    clients["alice"].delete(job_id)
    assert not outputs.exists()  # deleted with the job


def test_code_upload_refuses_bad_input(clients: dict[str, Client]) -> None:
    alice = clients["alice"]
    sha = "ab" * 32
    cases = [
        (("PUT", "/code/blobs/not-a-sha"), {"content": b"x"}, 422, "path parameter 'sha'"),
        (
            ("PUT", f"/code/blobs/{sha}"),
            {"params": {"offset": 5}, "content": b"x"},
            409,
            "resume at offset 0",
        ),
        (("PUT", f"/code/blobs/{sha}"), {"params": {"final": "true"}, "content": b"x"}, 422, "hash to"),
        (("POST", "/code/snapshots"), {"content": f"{sha} - ../x\n".encode()}, 422, "code path"),
        (("POST", "/code/snapshots"), {"content": f"{sha} - a\x00b\n".encode()}, 422, "code path"),
        (("POST", "/code/snapshots"), {"content": f"{sha} - a.py\n".encode()}, 409, "not uploaded"),
        (("POST", "/code/snapshots"), {"content": b"garbage\n"}, 422, "manifest line 1"),
    ]
    for (method, path), kwargs, status, words in cases:
        with pytest.raises(ApiError) as refused:
            alice.request(method, path, **kwargs)
        assert refused.value.status_code == status and words in refused.value.message, (
            path,
            refused.value.message,
        )
    with pytest.raises(ApiError) as unknown:
        alice.submit({"name": "c", "command": "true", "code": "cd" * 32})
    assert unknown.value.status_code == 404 and "does not exist" in unknown.value.message


def test_dataset_mounts_read_only_pinned_and_kept_while_in_use(
    clients: dict[str, Client], tmp_path: Path
) -> None:
    """alice pushes a dataset owned by vision and shares it with nlp: carol (nlp only) mounts it
    read-only in her job (a write fails), `@1` pins the first version after a second push, and
    deleting the version refuses while her job still runs (the lineage written at submit)."""
    alice, carol, bob = clients["alice"], clients["carol"], clients["bob"]
    src = tmp_path / "ds"
    src.mkdir()
    (src / "labels.txt").write_text("v1\n")
    alice.push_dataset("digits", src, group="vision")
    (src / "labels.txt").write_text("v2\n")
    alice.push_dataset("digits", src, group="vision")
    with pytest.raises(ApiError) as refused:  # not shared with nlp yet: carol may not read it
        carol.submit({"name": "d", "command": "true", "mounts": [{"source": "data/digits"}]})
    assert "digits" in str(refused.value)
    clients["admin"].share_dataset("digits", add_groups=["nlp"])
    job, log = run_job(
        carol,
        "cat /data/digits/labels.txt /pinned/labels.txt; touch /data/digits/x 2>/dev/null || echo RO",
        mounts=[{"source": "data/digits"}, {"source": "data/digits@1", "target": "/pinned"}],
    )
    assert job["state"] == "succeeded", log
    assert log.split() == ["v2", "v1", "RO"]
    assert [m["source"] for m in job["spec"]["mounts"]] == ["data/digits@2", "data/digits@1"]
    with pytest.raises(ApiError) as rw:
        carol.submit({"name": "d", "command": "true", "mounts": [{"source": "data/digits", "mode": "rw"}]})
    assert "read-only" in str(rw.value)
    running = carol.submit(
        {"name": "hold", "command": "sleep 60", "resources": {"cpus": 0.25, "memory": "64MiB"},
         "mounts": [{"source": "data/digits@1"}]}
    )  # fmt: skip
    with pytest.raises(ApiError) as in_use:
        bob.delete_dataset("digits", 1)  # vision's admin? bob is a member; the refusal names the job
    assert str(running["id"]) in str(in_use.value) or in_use.value.status_code == 403
    with pytest.raises(ApiError) as in_use_admin:
        clients["admin"].delete_dataset("digits", 1)
    assert in_use_admin.value.status_code == 409 and str(running["id"]) in str(in_use_admin.value)
    carol.cancel(running["id"])
    carol.wait(running["id"], timeout_s=60)
    clients["admin"].delete_dataset("digits", 1)
