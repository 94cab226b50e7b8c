"""`--code` blobs answer per caller (corral.services.storage, docs/security.md): a blob another
user stored reads as missing, must be sent, and is kept once on disk; a user's own and their
groups' members' blobs are present. Before, `POST /code/missing` told anyone whether a file of a
given hash was stored, and a manifest naming that hash got them a copy of it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from corral.storage import code
from corral.storage.layout import ensure_layout
from tests.api.conftest import SIMPLE_JOB, World

API = "/api/v1"
SECRET = b"alice's private notes: the launch is on Tuesday\n"
SHA = hashlib.sha256(SECRET).hexdigest()


def _missing(w: World, user: str) -> list[str]:
    r = w.client.post(f"{API}/code/missing", json={"hashes": [SHA]}, headers=w.as_(user))
    assert r.status_code == 200, r.text
    return list(r.json()["missing"])


def _put(w: World, user: str, data: bytes) -> Any:
    return w.client.put(
        f"{API}/code/blobs/{SHA}",
        params={"offset": 0, "final": "true"},
        content=data,
        headers={**w.as_(user), "Content-Type": "application/octet-stream"},
    )


def _snapshot(w: World, user: str) -> Any:
    return w.client.post(
        f"{API}/code/snapshots",
        content=f"{SHA} - notes.txt\n".encode(),
        headers={**w.as_(user), "Content-Type": "text/plain"},
    )


def test_another_users_blob_reads_as_missing_and_is_stored_once(world: World, settings: Any) -> None:
    w, root = world, Path(settings.storage_path)
    ensure_layout(root, "local")  # what the server does at start
    assert _missing(w, "alice") == [SHA]
    assert _put(w, "alice", SECRET).json() == {"sha256": SHA, "size": len(SECRET)}
    assert _missing(w, "alice") == []  # hers now
    assert _snapshot(w, "alice").status_code == 201
    blob = code.blob_path(root, SHA)
    inode = blob.stat().st_ino

    assert _missing(w, "carol") == [SHA]  # another group: stored or not, the same answer (was [])
    r = _snapshot(w, "carol")  # naming the hash alone gets her nothing (was 201: a copy of it)
    assert r.status_code == 409 and "not uploaded yet" in r.json()["detail"], r.text
    r = w.client.put(
        f"{API}/code/blobs/{SHA}",
        params={"offset": 0, "final": "true"},
        content=b"",
        headers={**w.as_("carol"), "Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 422 and "hash to" in r.text, r.text  # no size without the bytes (was 200)
    assert _missing(w, "bob") == []  # alice's group (vision): its members' blobs count

    # carol holds the file too: she sends it, it is checked and dropped for the stored copy.
    assert _put(w, "carol", SECRET).json() == {"sha256": SHA, "size": len(SECRET)}
    assert blob.stat().st_ino == inode and blob.read_bytes() == SECRET
    assert list((root / "code" / "incoming").iterdir()) == []
    assert _missing(w, "carol") == []
    assert _snapshot(w, "carol").status_code == 201


def _submit(w: World, user: str, snapshot: str) -> Any:
    return w.client.post(f"{API}/jobs", json={**SIMPLE_JOB, "code": snapshot}, headers=w.as_(user))


def test_a_snapshot_runs_only_for_its_uploaders_and_their_groups(world: World, settings: Any) -> None:
    """A snapshot id (`code:` in a spec) was not per caller: a job naming another user's snapshot
    was accepted (201), so anyone told the id ran that user's code. Now it reads as missing to
    them, as a snapshot nobody made does, until they post its manifest with its blobs theirs."""
    w = world
    ensure_layout(Path(settings.storage_path), settings.engine)
    assert _put(w, "alice", SECRET).status_code == 200
    r = _snapshot(w, "alice")
    assert r.status_code == 201, r.text
    snap = r.json()["id"]
    assert _submit(w, "alice", snap).status_code == 201
    assert _submit(w, "bob", snap).status_code == 201  # her group's (vision) member
    r = _submit(w, "carol", snap)  # another group: told the id, she ran alice's code (was 201)
    assert r.status_code == 404 and f"code snapshot {snap} does not exist" in r.json()["detail"], r.text
    nobodys = _submit(w, "carol", "cd" * 32).json()["detail"]
    assert nobodys == r.json()["detail"].replace(snap, "cd" * 32)  # the same answer: no probing
    # carol holds the files too: she sends them and posts the same manifest; it is hers then
    assert _put(w, "carol", SECRET).status_code == 200
    assert _snapshot(w, "carol").json() == {"id": snap}
    assert _submit(w, "carol", snap).status_code == 201
