"""Content-addressed `--code` snapshots on the storage root (server side).

The client hashes its files (sha256), asks which hashes the server lacks (`missing`), uploads
only those in chunks (`receive_chunk`; an unchanged resubmit uploads nothing), then sends the
manifest (`make_snapshot`): {path: {sha256, executable}}. The snapshot's id is the sha256 of the
canonical manifest; its tree under `code/snapshots/<id>/` is made of read-only hard links to the
blobs, built in a temporary dir and renamed into place (a snapshot is complete or absent). Jobs
get it bound read-only at /code, their working dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path

from corral.words import plural

SHA_RE = re.compile(r"^[0-9a-f]{64}$")
CHUNK_MAX = 512 * 1024  # below the API's body limit
MAX_PATH = 1024
# What check_path accepts, for schemas: '/'-separated parts, none empty, '.' or '..', without
# backslashes or control characters (a part starts with a non-dot, or is a dot and a non-dot,
# or two dots and more: no lookaround, so Rust's regex in pydantic reads it too).
_C = r"[^/\\\x00-\x1f\x7f]"
_NOT_DOT = r"[^/\\.\x00-\x1f\x7f]"
PATH_PART = rf"(?:{_NOT_DOT}{_C}*|\.{_NOT_DOT}{_C}*|\.\.{_C}+)"
RELATIVE_PATH_PATTERN = rf"^{PATH_PART}(?:/{PATH_PART})*$"
INCOMING_TTL_S = 24 * 3600.0  # a partial upload untouched this long is abandoned: deleted


class CodeError(ValueError):
    """A bad upload or manifest; the message names the file or hash."""


class ChunkOutOfOrder(CodeError):
    def __init__(self, sha: str, have: int, offset: int) -> None:
        super().__init__(f"blob {sha}: the server has {have} bytes, the chunk starts at {offset}")
        self.have = have


def check_sha(sha: str) -> str:
    if not SHA_RE.match(sha):
        raise CodeError(f"{sha!r} is not a sha256 (64 lowercase hex digits)")
    return sha


def blob_path(root: Path, sha: str) -> Path:
    return root / "code" / "blobs" / sha[:2] / check_sha(sha)


def snapshot_dir(root: Path, snapshot_id: str) -> Path:
    return root / "code" / "snapshots" / check_sha(snapshot_id)


def missing(root: Path, hashes: list[str]) -> list[str]:
    """The hashes without a blob; also drops partial uploads abandoned for INCOMING_TTL_S (the
    incoming dir holds only uploads in flight, so this stays a short listing)."""
    sweep_incoming(root, time.time())
    return sorted({h for h in map(check_sha, hashes) if not blob_path(root, h).exists()})


def sweep_incoming(root: Path, now: float) -> int:
    removed = 0
    with os.scandir(root / "code" / "incoming") as entries:
        for entry in entries:
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime > INCOMING_TTL_S:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
    return removed


def _incoming(root: Path, sha: str, uploader: str) -> Path:
    return root / "code" / "incoming" / f"{check_sha(sha)}{'.' + uploader if uploader else ''}.part"


def receive_chunk(
    root: Path, sha: str, offset: int, data: bytes, final: bool, max_bytes: int, *, uploader: str = ""
) -> int:
    """Append `data` at `offset` of `uploader`'s partial upload of the blob (resumable: a chunk
    sent twice or out of order is answered with how much is there; each uploader has their own,
    so nobody learns how far another's got); on `final`, check the hash and publish the blob, or
    drop the bytes when it is stored already (one copy on disk). Returns the bytes held. A blob
    stored already is received all the same: its bytes are what shows the uploader holds the
    file (corral.services.storage decides who need not send them)."""
    blob = blob_path(root, sha)
    if len(data) > CHUNK_MAX:
        raise CodeError(f"blob {sha}: chunks are at most {CHUNK_MAX} bytes")
    part = _incoming(root, sha, uploader)
    have = part.stat().st_size if part.exists() else 0
    if offset != have:
        raise ChunkOutOfOrder(sha, have, offset)
    if have + len(data) > max_bytes:
        part.unlink(missing_ok=True)
        raise CodeError(f"blob {sha} is larger than the code limit of {max_bytes} bytes")
    with open(part, "ab") as f:
        f.write(data)
    if not final:
        return have + len(data)
    digest = hashlib.sha256()
    with open(part, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != sha:
        part.unlink(missing_ok=True)
        raise CodeError(f"blob {sha}: the uploaded bytes hash to {digest.hexdigest()}; send it again")
    if blob.exists():  # deduplicated: the stored copy stays, these bytes go
        part.unlink(missing_ok=True)
        return blob.stat().st_size
    os.chmod(part, 0o444)
    blob.parent.mkdir(mode=0o700, exist_ok=True)
    os.replace(part, blob)
    return blob.stat().st_size


def check_path(path: str, what: str = "code path") -> str:
    """A relative '/'-separated path with no empty, '.', '..' or control-character parts; `what`
    names it in the error (a snapshot's "code path", a job's "output path")."""
    if not path or len(path) > MAX_PATH or path.startswith("/") or "\\" in path:
        raise CodeError(f"{what} {path!r} must be a relative path (at most {MAX_PATH} characters)")
    for part in path.split("/"):
        if part in ("", ".", "..") or any(ord(c) < 32 or ord(c) == 127 for c in part):
            raise CodeError(f"{what} {path!r}: no empty, '.', '..' or control-character parts")
    return path


def make_snapshot(root: Path, manifest: dict[str, dict[str, object]], max_bytes: int, max_files: int) -> str:
    """Publish the snapshot of `manifest` ({path: {"sha256": ..., "executable": bool}}) and
    return its id; every blob must have been uploaded."""
    if len(manifest) > max_files:
        raise CodeError(f"the code has {len(manifest)} files; at most {max_files} are allowed")
    entries: dict[str, tuple[str, bool]] = {}
    for path, meta in manifest.items():
        sha, exe = meta.get("sha256"), meta.get("executable", False)
        if not isinstance(sha, str) or not isinstance(exe, bool):
            raise CodeError(f"code path {path!r}: give sha256 (text) and executable (true/false)")
        entries[check_path(path)] = (check_sha(sha), exe)
    paths = set(entries)
    for path in paths:  # a file cannot also be a directory of another entry
        parent = path.rpartition("/")[0]
        while parent:
            if parent in paths:
                raise CodeError(f"code path {parent!r} is both a file and a directory")
            parent = parent.rpartition("/")[0]
    absent = missing(root, [sha for sha, _ in entries.values()])
    if absent:
        raise CodeError(
            f"{plural(len(absent), 'file')} {'was' if len(absent) == 1 else 'were'} not uploaded, "
            f"e.g. blob {absent[0]}"
        )
    total = sum(blob_path(root, sha).stat().st_size for sha, _ in set(entries.values()))
    if total > max_bytes:
        raise CodeError(f"the code is {total} bytes; at most {max_bytes} are allowed (use .corralignore)")
    canonical = json.dumps(sorted((p, s, e) for p, (s, e) in entries.items()), separators=(",", ":"))
    snap_id = hashlib.sha256(canonical.encode()).hexdigest()
    final = snapshot_dir(root, snap_id)
    if final.is_dir():
        return snap_id
    tmp = final.with_name(f".tmp-{snap_id[:16]}-{secrets.token_hex(4)}")
    tmp.mkdir(mode=0o755)
    try:
        for path, (sha, exe) in sorted(entries.items()):
            dest = tmp / path
            dest.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.link(_blob_variant(root, sha, exe), dest)
        os.rename(tmp, final)
    except FileExistsError:
        pass  # the same snapshot published meanwhile
    except OSError as exc:
        if not final.is_dir():
            raise CodeError(f"could not build snapshot {snap_id}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return snap_id


def _blob_variant(root: Path, sha: str, executable: bool) -> Path:
    """The blob itself (0444), or for an executable file its 0555 twin (a hard link shares the
    mode, so the two need two inodes)."""
    blob = blob_path(root, sha)
    if not executable:
        return blob
    exe = blob.with_name(f"{sha}.x")
    if not exe.exists():
        tmp = blob.with_name(f".{sha}.x.{secrets.token_hex(4)}")
        shutil.copyfile(blob, tmp)
        os.chmod(tmp, 0o555)
        os.replace(tmp, exe)
    return exe


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
