"""The client side of dataset transfers (the SDK's push_dataset / pull_dataset and the CLI):
scan and checksum a local directory, then drive the upload protocol of corral.datasets.uploads;
download a version's files and check each against its sha256.

A push killed at any point is resumed by pushing the same directory again: the server keeps the
session (same name, owner and manifest digest) with the bytes of every file received so far,
and the client sends only what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from corral.datasets.names import BadName, check_path, manifest_digest, parse_manifest
from corral.datasets.store import file_sha256, walk_files

if TYPE_CHECKING:
    from corral.sdk.base import BaseClient

REGISTER_BATCH = 1000
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, '/'-separated
    full: Path
    size: int
    sha256: str


def scan(directory: Path) -> list[LocalFile]:
    """Every file below `directory` with its size and sha256 (links pointing outside refused)."""
    from corral.sdk.errors import CorralError

    if not directory.exists():  # "is not a directory" for a path that is nothing at all misled
        raise CorralError(f"{directory} does not exist")
    if not directory.is_dir():
        raise CorralError(f"{directory} is not a directory")
    try:
        found = [(rel, full) for rel, full in walk_files(directory)]
    except BadName as exc:
        raise CorralError(str(exc))
    if not found:
        raise CorralError(f"{directory} holds no files")
    return [LocalFile(rel, full, full.stat().st_size, file_sha256(full)) for rel, full in sorted(found)]


def push(
    client: BaseClient, name: str, directory: Path, *, group: str | None, progress: Progress | None
) -> dict[str, Any]:
    files = scan(directory)
    total = sum(f.size for f in files)
    digest = manifest_digest((f.path, f.size, f.sha256) for f in files)
    body = {"name": name, "group": group, "bytes": total, "files": len(files), "digest": digest}
    upload = client.request("POST", "/datasets/uploads", json=body)
    uid, chunk = upload["id"], int(upload["chunk_bytes"])
    if upload["registered_files"] < len(files):  # a resumed session may have them all already
        for i in range(0, len(files), REGISTER_BATCH):
            batch = [
                {"path": f.path, "size": f.size, "sha256": f.sha256} for f in files[i : i + REGISTER_BATCH]
            ]
            client.request("POST", f"/datasets/uploads/{uid}/files", json={"files": batch})
    pending = _pending(client, uid)
    done = total - sum(p["size"] - p["received"] for p in pending)
    if progress:
        progress(done, total)
    by_path = {f.path: f for f in files}
    for item in pending:
        local = by_path[item["path"]]
        done = _send_file(client, uid, local, int(item["received"]), chunk, done, total, progress)
    result = client.request("POST", f"/datasets/uploads/{uid}/complete")
    return dict(result) | {"resumed": bool(upload["resumed"])}


def _pending(client: BaseClient, uid: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = ""
    while True:
        page = client.request(
            "GET", f"/datasets/uploads/{uid}/pending", params={"after": after, "limit": 1000}
        )
        out.extend(page)
        if len(page) < 1000:
            return out
        after = page[-1]["path"]


def _send_file(
    client: BaseClient,
    uid: str,
    local: LocalFile,
    offset: int,
    chunk: int,
    done: int,
    total: int,
    progress: Progress | None,
) -> int:
    """Send `local` from `offset` on, chunk by chunk; returns the new bytes-done count."""
    query = f"/datasets/uploads/{uid}/chunk?path={quote(local.path, safe='')}"
    headers = {"Content-Type": "application/octet-stream"}
    with local.full.open("rb") as fh:
        fh.seek(offset)
        while True:
            data = fh.read(chunk)
            if not data and offset > 0:
                return done
            client.request("PUT", f"{query}&offset={offset}", content=data, headers=headers)
            offset += len(data)
            done += len(data)
            if progress:
                progress(done, total)
            if not data or offset >= local.size:
                return done


def pull(
    client: BaseClient, name: str, directory: Path, *, version: int | None, progress: Progress | None
) -> dict[str, Any]:
    """Download every file of the version into `directory`; a file is written to a temporary
    name, checked, then renamed, so an interrupted pull leaves no half file under its name."""
    from corral.sdk.errors import CorralError

    which = "latest" if version is None else str(version)
    with client.download(f"/datasets/{name}/versions/{which}/manifest") as response:
        response.read()
        number = int(response.headers.get("X-Corral-Version", "0"))
        entries = parse_manifest(response.text)
    total = sum(size for _, size, _ in entries)
    done = 0
    directory.mkdir(parents=True, exist_ok=True)
    for path, size, sha in entries:
        target = directory.joinpath(*check_path(path).split("/"))
        if target.is_file() and target.stat().st_size == size and file_sha256(target) == sha:
            done += size  # already there, identical: a resumed pull
        else:
            done = _fetch(
                client,
                f"/datasets/{name}/versions/{number}/files/{quote(path)}",
                target,
                done,
                total,
                progress,
            )
            if file_sha256(target) != sha:
                target.unlink()
                raise CorralError(f"{path}: the bytes received do not match its sha256; pull again")
        if progress:
            progress(done, total)
    return {"name": name, "version": number, "files": len(entries), "bytes": total}


def _fetch(
    client: BaseClient, url: str, target: Path, done: int, total: int, progress: Progress | None
) -> int:
    def shown(so_far: int) -> None:
        if progress:
            progress(done + so_far, total)

    return done + client.download_to(url, None, target, on_progress=shown)
